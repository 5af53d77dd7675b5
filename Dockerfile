# Celeris: the playground + OpenAI-compatible API (app.py) in one container, on 0.0.0.0:7860.
#
#   GPU:  docker build -t celeris .
#         docker run --gpus all -p 7860:7860 -e CELERIS_API_KEY=change-me celeris
#   CPU:  docker build --build-arg BASE=cpu -t celeris-cpu .
#         docker run -p 7860:7860 -e CELERIS_API_KEY=change-me celeris-cpu
#
# models/celeris-tiny-bd (the default, block diffusion), models/celeris-tiny (full attention:
# the Infill tab and the Race tab's full-canvas column) and their AR twin (the Race tab) are
# baked in. Another model is mounted, and named after the image name:
#   docker run --gpus all -p 7860:7860 -e CELERIS_API_KEY=change-me \
#       -v /path/to/model:/models/mine:ro celeris --model /models/mine
# Without CELERIS_API_KEY the container refuses to start (it listens beyond loopback);
# append --allow-no-key (or -e CELERIS_ALLOW_NO_KEY=1) to serve an open demo on purpose.
ARG BASE=cuda

# The CUDA runtime base: PyPI's Linux torch wheel is the CUDA build and brings its own
# CUDA libraries; the base supplies the user-space driver hooks for --gpus.
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04 AS base-cuda
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
ENV TORCH_INDEX_URL=https://pypi.org/simple

# The CPU base: torch's CPU-only wheel (no CUDA libraries, ~1 GB smaller).
FROM python:3.11.13-slim-bookworm AS base-cpu
ENV TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

FROM base-${BASE} AS app
ENV PYTHONUNBUFFERED=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    HF_HUB_DISABLE_TELEMETRY=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
RUN python3 -m venv /opt/venv
WORKDIR /app
# The same pinned requirements as ./launch.sh; torch first, at the pin requirements.txt names,
# from the index that matches the base.
# --quantize's libraries too (requirements-quant.txt): an image is for the GPU boxes it needs.
COPY requirements.txt requirements-quant.txt ./
RUN pip install --no-cache-dir --index-url "$TORCH_INDEX_URL" \
        "$(grep -E '^torch==' requirements.txt)" \
    && pip install --no-cache-dir -r requirements.txt -r requirements-quant.txt
COPY app.py ./
COPY celeris ./celeris
COPY ui ./ui
COPY assets ./assets
COPY models/celeris-tiny-bd ./models/celeris-tiny-bd
COPY models/celeris-tiny ./models/celeris-tiny
COPY models/celeris-tiny-ar ./models/celeris-tiny-ar
RUN useradd --create-home --shell /usr/sbin/nologin celeris
USER celeris
EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7860/health')"]
ENTRYPOINT ["python3", "app.py", "--host", "0.0.0.0", "--port", "7860", "--require-key"]
CMD []
