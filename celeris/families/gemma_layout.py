"""DiffusionGemma's layout: canvases written one after another, each denoised from noise.

DiffusionGemma (transformers' model, wrapped in ``model/diffusion_gemma.py``) is block-causal in the engine's words: the
answer is written canvas after canvas (``canvas_length`` positions, the model's block), and a
canvas sees the prompt and every finished canvas through an exact cache. What differs from
``BlockLayout`` is how a canvas is decoded, so this layout runs its own step for its rows
(``run``, called by ``Runner.run``): the model is an encoder/decoder pair with a per-layer
cache of two head shapes, which the runner's one-window forward and ``SlotKVCache`` do not
describe. The runner keeps everything else (admission, slot numbers from a ``SlotPool``, release), and
the engine its one step, finish rule, events, ``generate``/``stream`` and the server.

One step of a request (the reference's ``generate()``, transformers' diffusion_gemma):

1. tokens not yet encoded (the prompt, or the canvas just finished) go through the causal
   encoder into the request's ``GemmaCache``; a new canvas starts as uniform random tokens;
2. the decoder denoises the canvas, conditioned on the previous step's scaled logits;
3. the logits are divided by the step's temperature, linear from ``t_max`` at the first step
   to ``t_min`` at the last, times the request's ``temperature`` (1 = the checkpoint's
   schedule; 0 = argmax: the limit of a vanishing temperature, deterministic: without a
   seed it draws its canvas noise from seed 0); a token is sampled per
   position; the positions of lowest entropy are accepted while the sum of their entropies
   minus the largest stays within ``entropy_bound`` (the entropy-bound sampler), the others
   are drawn again uniformly (renoised);
4. the canvas is done when its argmax has not changed for ``stability_threshold`` steps and
   the mean entropy is below ``confidence_threshold``, or after ``max_denoising_steps`` steps
   (``steps`` per canvas when the request gives it); its argmax is then committed at once.

A step that does not finish its canvas commits nothing and leaves the canvas's draft (the
step's argmax, what would be committed) in ``Request.draft``; its event shows the draft in
place of the masks, listed in ``StepEvent.draft``: the playground draws tokens changing, not
masks disappearing. The event's ``text`` stays the accepted text only.

Random draws come from the request's own generator in the reference's order (canvas, then per
step the samples and the renoising draw, also at temperature 0), so a request seeded like
``torch.manual_seed(seed)`` before the reference's ``generate()`` gives the same tokens
(tests/test_diffusion_gemma.py). Sampler settings come from the checkpoint's
generation_config.json (``diffusion_gemma.read_sampler``). GenerationParams' decoding,
remasking, threshold, factor, confidence_dtype and token editing do not apply to this sampler: a request that
sets them is refused naming the field (``check``); so are logit_bias and the presence/frequency
penalties, which only the shared sampler (``RowKnobs.choose``) applies.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ..cache import SlotPool
from ..config import NonFiniteLogitsError
from ..model.diffusion_gemma import SAMPLER_DEFAULTS, GemmaCache
from .layouts import infill_refusal

if TYPE_CHECKING:
    from ..engine.request import Request


@dataclass(eq=False)
class _CanvasState:
    """What a request carries between steps besides its ``Request`` fields."""

    cache: GemmaCache | None = None          # made by the model at the first step
    canvas: torch.Tensor | None = None       # (1, L) the noisy canvas fed to the decoder
    argmax: torch.Tensor | None = None       # (1, L) the latest argmax (the draft)
    sc: torch.Tensor | None = None           # (1, L, V) the previous step's scaled logits
    history: torch.Tensor | None = None      # (S, 1, L) the last S argmax canvases
    left: int = 0                            # denoising steps left for this canvas
    total: int = 0                           # denoising steps this canvas may take


class GemmaLayout:
    block_causal = True
    caches = ("none", "prefix")     # the encoder cache is exact either way and always kept
    strict_threshold = False
    shift = False

    def __init__(self, config: Any, mask: int) -> None:
        self.mask, self.block_size = mask, int(config.canvas_length)
        self.vocab = int(config.vocab_size)
        self.sampler = dict(getattr(config, "sampler", None) or SAMPLER_DEFAULTS)
        self.states: weakref.WeakKeyDictionary["Request", _CanvasState] = \
            weakref.WeakKeyDictionary()
        self._batch: tuple | None = None     # the decoder's batch cache for the last batch

    # ------------------------------------------------------------ the layout questions
    def defaults(self) -> dict[str, Any]:
        """One canvas a unit, the encoder cache kept, the checkpoint's step count."""
        return {"block_length": self.block_size, "cache": "prefix", "steps": None}

    def fit_defaults(self, changes: dict[str, Any]) -> dict[str, Any]:
        return changes

    def stops_at_eos(self, req: "Request") -> bool:
        return True

    def start(self, req: "Request") -> None:
        """The first canvas; at temperature 0 without a seed the canvas noise is drawn from
        seed 0, so that temperature 0 is deterministic here as for every other family (the
        result reports the seed used)."""
        if req.params.seed is None and req.params.temperature == 0:
            req.seed = 0
        P, L = req.prompt_len, self.block_size
        req.block_start, req.unit = P, 0
        req.seq = list(req.prompt_ids) + [self.mask] * L
        req.end, req.todo = P + req.params.gen_length, req.params.gen_length
        req.lo, req.hi = P, min(P + L, req.end)
        self.states[req] = _CanvasState()

    def after_forward(self, req: "Request") -> None:
        cache = self.states[req].cache
        req.cached = 0 if cache is None else cache.length

    def advance(self, req: "Request") -> None:
        """A committed canvas opens the next one (the answer is not over: the engine ended
        the request otherwise)."""
        if self.mask in req.seq[req.lo:req.hi]:
            return
        L = self.block_size
        req.block_start += L
        req.seq += [self.mask] * L
        req.lo, req.hi = req.block_start, min(req.block_start + L, req.end)
        req.blocks_done += 1
        req.unit += 1

    def check(self, params: Any, canvas: Any = None, model: str = "DiffusionGemma") -> None:
        """What DiffusionGemma's sampler cannot honour, refused with the field named."""
        if canvas is not None:
            raise ValueError(infill_refusal(model))
        L = self.block_size
        if params.block_length != L:
            raise ValueError(f"block_length must be the model's canvas_length ({L}) for "
                             f"DiffusionGemma, got {params.block_length}")
        for name, ok, allowed in (("cfg_scale", params.cfg_scale == 0, "0"),
                                  ("top_k", params.top_k == 0, "0"),
                                  ("top_p", params.top_p == 1.0, "1.0"),
                                  ("defer_eos", not params.defer_eos, "false"),
                                  ("first_token", params.first_token == "policy", "'policy'"),
                                  ("cache", params.cache in self.caches, "'prefix' or 'none'"),
                                  ("decoding", params.decoding == "fixed", "'fixed'"),
                                  ("remasking", params.remasking == "low_confidence",
                                   "'low_confidence'"),
                                  ("threshold", params.threshold == 0.9, "left unset (0.9)"),
                                  ("factor", params.factor == 1.0, "left unset (1.0)"),
                                  ("edit_threshold", not params.edits, "unset"),
                                  ("confidence_dtype", params.confidence_dtype == "float32",
                                   "'float32'"),
                                  ("logit_bias", not params.logit_bias, "empty"),
                                  ("presence_penalty", params.presence_penalty == 0, "0"),
                                  ("frequency_penalty", params.frequency_penalty == 0, "0"),
                                  ("structured", params.structured is None, "unset"),
                                  ("logprobs", params.logprobs is None, "unset")):
            if not ok:
                raise ValueError(f"{name} must be {allowed} for DiffusionGemma (its "
                                 f"entropy-bound sampler decides what a step accepts and has "
                                 f"no such option), got {getattr(params, name)!r}")

    def new_cache(self, model: Any, slots: int) -> SlotPool:
        """Slot numbers only: the keys/values live in each request's ``GemmaCache``."""
        return SlotPool(slots)

    def release(self, req: "Request") -> None:
        self.states.pop(req, None)
        self._batch = None

    # ------------------------------------------------------------ the step
    def run(self, runner: Any, reqs: list["Request"]) -> None:
        """Encode what is new, one decoder forward for every row, sample, commit."""
        model, dev = runner.model, runner.device
        reqs = sorted(reqs, key=lambda r: r.slot)
        states = [self.states[r] for r in reqs]
        forward_s = 0.0
        for r, st in zip(reqs, states):
            if r.generator is None:
                r.generator = torch.Generator(device=dev).manual_seed(r.seed)
            if st.cache is None:
                st.cache = model.new_cache()
            if st.cache.length < r.block_start:            # the prompt, or a finished canvas
                ids = torch.tensor([r.seq[st.cache.length:r.block_start]], device=dev)
                t0 = time.perf_counter()
                model.encode(ids, st.cache)
                forward_s += time.perf_counter() - t0
            if st.left == 0:                               # a fresh canvas of noise
                self._new_canvas(r, st, dev)
        L = self.block_size
        canvas = torch.cat([st.canvas for st in states])                          # (B, L)
        pos = torch.tensor([r.block_start for r in reqs], device=dev)[:, None] + \
            torch.arange(L, device=dev)
        batch = self._stacked(model, states)
        t0 = time.perf_counter()
        logits = model.denoise(canvas, pos, batch, *self._sc(states))
        runner.forward_s = forward_s + time.perf_counter() - t0                 # (B, L, V)
        stop = list(runner.special.stop)
        rows = []
        for b, (r, st) in enumerate(zip(reqs, states)):
            raw = logits[b:b + 1]
            bad = ~torch.isfinite(raw).all()
            if r.params.suppress_eos:
                raw = raw.clone()
                raw[..., stop] = float("-inf")
            rows.append(self._sample(r, st, raw, bad))
        host = torch.stack(rows).tolist()                                         # one sync
        for r, st, row in zip(reqs, states, host):
            self.after_forward(r)
            if row[1] > 0:
                r.failure = NonFiniteLogitsError([r.request_id])
                continue
            r.nfe += 1
            w = r.hi - r.lo
            if row[0] > 0 or st.left == 0:     # stable and confident, or out of steps
                st.left, r.draft = 0, ()
                r.commit(row[2:2 + w], [1.0] * w, row[2 + L:2 + L + w], self.mask, stop)
            else:
                r.draft = tuple(int(t) for t in row[2:2 + w])
                r.commit([], [], [], self.mask, stop)

    def _new_canvas(self, r: "Request", st: _CanvasState, dev: torch.device) -> None:
        s, g = self.sampler, r.generator
        st.canvas = torch.randint(0, self.vocab, (1, self.block_size), generator=g, device=dev)
        st.argmax, st.sc = st.canvas, None
        S = s["stability_threshold"]
        st.history = torch.full((S, 1, self.block_size), -1, dtype=torch.long, device=dev)
        p = r.params
        st.total = st.left = p.steps_per_block if p.steps is not None \
            else s["max_denoising_steps"]

    def _sample(self, r: "Request", st: _CanvasState, raw: torch.Tensor, bad: torch.Tensor
                ) -> torch.Tensor:
        """One step of the entropy-bound sampler for one row, raw (1, L, V) float32 ->
        [done, non-finite, argmax (L), top probability (L)] as one float64 row."""
        s, g, T = self.sampler, r.generator, r.params.temperature
        step = torch.tensor(st.left, dtype=torch.int32, device=raw.device)
        temp = s["t_min"] + (s["t_max"] - s["t_min"]) * (step / st.total)
        if T > 0:
            scaled = raw / (temp if T == 1.0 else temp * T)
        else:                     # the vanishing-temperature limit: all mass on the argmax
            scaled = torch.full_like(raw, float("-inf")).scatter_(
                -1, raw.argmax(-1, keepdim=True), 0.0)
        V, L = raw.shape[-1], raw.shape[1]
        probs = F.softmax(scaled, dim=-1, dtype=torch.float32)
        drawn = torch.multinomial(probs.view(-1, V), 1, generator=g).view(1, L)
        argmax = scaled.argmax(-1)                                                # (1, L)
        entropy = _entropy(scaled)                                                # (1, L)
        ordered, order = torch.sort(entropy, dim=-1)
        within = (torch.cumsum(ordered, dim=-1) - ordered) <= s["entropy_bound"]
        accept = torch.zeros_like(within).scatter(-1, order, within)
        kept = torch.where(accept, drawn, st.canvas)
        noise = torch.randint(0, self.vocab, (1, L), generator=g, device=raw.device)
        st.canvas = torch.where(~accept, noise, kept)
        if s["stability_threshold"] == 0:
            stable = torch.ones((), dtype=torch.bool, device=raw.device)
        else:
            stable = (st.history == argmax[None]).all(-1).all(0)[0]
            st.history = torch.roll(st.history, shifts=-1, dims=0)
            st.history[-1] = argmax
        done = stable & (entropy.mean(-1)[0] < s["confidence_threshold"])
        st.sc = scaled.to(st.cache.layer(0)[0].dtype)
        st.argmax = argmax
        st.left -= 1
        return torch.cat([done.double()[None], bad.double()[None], argmax[0].double(),
                          probs.amax(-1)[0].double()])

    def _sc(self, states: list[_CanvasState]) -> tuple:
        """The self-conditioning logits (B, L, V) (None: no row has any) and which rows have
        them (None: all)."""
        if all(st.sc is None for st in states):
            return None, None
        if all(st.sc is not None for st in states):
            return torch.cat([st.sc for st in states]), None
        ref = next(st.sc for st in states if st.sc is not None)
        logits = torch.cat([ref if st.sc is None else st.sc for st in states])
        rows = torch.tensor([st.sc is not None for st in states], device=ref.device)
        return logits, rows

    def _stacked(self, model: Any, states: list[_CanvasState]) -> tuple:
        """The rows' caches as the decoder's batch cache (``DiffusionGemma.stack``), rebuilt
        only when the batch or a row's cache changed."""
        key = tuple((id(st), st.cache.version) for st in states)
        if self._batch is None or self._batch[0] != key:
            self._batch = (key, model.stack([st.cache for st in states]))
        return self._batch[1]


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    """The entropy of each categorical distribution over the last dim, computed as
    ``torch.distributions.Categorical(logits=...).entropy()`` does (the reference's
    sampler and stopping rule use that)."""
    logp = logits - logits.logsumexp(dim=-1, keepdim=True)
    probs = F.softmax(logp, dim=-1)
    return -(logp.clamp(min=torch.finfo(logp.dtype).min) * probs).sum(-1)
