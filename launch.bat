@echo off
rem Celeris one-click launcher (Windows).
rem
rem   launch.bat [app args]          start the playground + API (app.py) on http://localhost:7860
rem   launch.bat test [pytest args]  install the dev requirements and run the whole test suite
rem   launch.bat --help              the options, at once (installs nothing)
rem
rem Creates .venv with python when it is missing and (re)installs requirements only when
rem requirements*.txt changed since the last successful install (a sha256 stamp in .venv\).
rem Celeris itself is installed editable (pip install -e .), which gives the `celeris` command.
setlocal EnableExtensions
cd /d "%~dp0"

set "GRADIO_ANALYTICS_ENABLED=False"
set "HF_HUB_DISABLE_TELEMETRY=1"
set "PYTHONUNBUFFERED=1"

set "VENV=.venv"
set "PY=%VENV%\Scripts\python.exe"
set "RUNTIME_STAMP=%VENV%\.celeris-req-hash"
set "DEV_STAMP=%VENV%\.celeris-req-hash-dev"
rem Exit code 0 when the stamp (argv 2) holds the current sha256 of requirements*.txt, else 1;
rem with "write" as argv 1 it stores that hash. Same logic as launch.sh.
set "HASH_PY=import glob,hashlib,os,sys;h=hashlib.sha256();[h.update(n.encode()+b'\0'+open(n,'rb').read()) for n in sorted(glob.glob('requirements*.txt'))];d=h.hexdigest();m,s=sys.argv[1],sys.argv[2];old=open(s).read().strip() if os.path.exists(s) else '';open(s,'w').write(d+'\n') if m=='write' else sys.exit(0 if old==d else 1)"

rem --help answers before anything is created or installed.
if /i "%~1"=="test" goto help_checked
for %%A in (%*) do (
    if /i "%%~A"=="--help" goto usage
    if /i "%%~A"=="-h" goto usage
)
:help_checked

if exist "%PY%" goto venv_ready
where python >nul 2>nul
if errorlevel 1 (
    echo [celeris] error: python not found; install Python 3.10 or newer from python.org
    exit /b 1
)
python -c "import sys; sys.exit(sys.version_info < (3, 10))"
if errorlevel 1 (
    echo [celeris] error: Python 3.10 or newer is required
    exit /b 1
)
echo [celeris] creating virtual environment in %VENV%
python -m venv "%VENV%"
if errorlevel 1 (
    echo [celeris] error: could not create %VENV%
    exit /b 1
)
:venv_ready

if /i "%~1"=="test" goto test_mode

rem ---------------------------------------------------------------- app mode
set "REQ_FILE=requirements.txt"
set "STAMP1=%RUNTIME_STAMP%"
set "STAMP2="
call :ensure_requirements
if errorlevel 1 exit /b 1
call :ensure_package
if errorlevel 1 exit /b 1
echo [celeris] starting Celeris; app.py prints the playground's address (Ctrl+C to stop)
"%PY%" app.py %*
exit /b

rem ---------------------------------------------------------------- test mode
:test_mode
set "REQ_FILE=requirements-dev.txt"
set "STAMP1=%DEV_STAMP%"
set "STAMP2=%RUNTIME_STAMP%"
call :ensure_requirements
if errorlevel 1 exit /b 1
call :ensure_package
if errorlevel 1 exit /b 1
rem Drop the leading "test" and pass the rest to pytest verbatim (shift would split "a=b").
set "PYTEST_ARGS=%*"
set "PYTEST_ARGS=%PYTEST_ARGS:*test=%"
echo [celeris] running: python -m pytest%PYTEST_ARGS%
"%PY%" -m pytest%PYTEST_ARGS%
set "RC=%ERRORLEVEL%"
echo [celeris] pytest exited with code %RC%
exit /b %RC%

rem ---------------------------------------------------------------- help
:usage
echo usage: launch.bat [OPTIONS]            start the playground and the OpenAI API on one port
echo        launch.bat test [PYTEST ARGS]   install the dev requirements and run the tests
echo        launch.bat --help               this help (installs nothing)
echo.
echo The first start creates .venv and installs requirements.txt (a few minutes); later starts
echo reuse it. OPTIONS go to app.py; the common ones:
echo.
echo   --port N          port of the playground and the API, 1-65535 (default 7860;
echo                     env GRADIO_SERVER_PORT)
echo   --host ADDR       interface to listen on (default 127.0.0.1, this machine only;
echo                     0.0.0.0: every interface, then set an API key; env GRADIO_SERVER_NAME)
echo   --model DIR       model directory or hub id (default models\celeris-tiny-bd)
echo   --models DIR,DIR  the models a visitor may pick in the Model tab
echo   --api-key KEY     require this key on /v1 and as the playground's password
echo                     (better: env CELERIS_API_KEY, kept out of the process list)
echo   --device DEVICE   auto (default), cpu or cuda
echo.
echo Every option: .venv\Scripts\python.exe app.py --help (once .venv exists).
exit /b 0

rem ---------------------------------------------------------------- helpers
:ensure_requirements
"%PY%" -c "%HASH_PY%" check "%STAMP1%"
if not errorlevel 1 exit /b 0
echo [celeris] installing %REQ_FILE% into %VENV% (only when requirements change; first time takes a minute)
"%PY%" -m pip install --disable-pip-version-check --progress-bar on -r "%REQ_FILE%"
if errorlevel 1 (
    echo [celeris] error: pip install -r %REQ_FILE% failed
    exit /b 1
)
"%PY%" -c "%HASH_PY%" write "%STAMP1%"
if defined STAMP2 "%PY%" -c "%HASH_PY%" write "%STAMP2%"
echo [celeris] requirements up to date
exit /b 0

rem The celeris package, editable (gives the `celeris` command); only when it is missing.
:ensure_package
if exist "%VENV%\Scripts\celeris.exe" exit /b 0
echo [celeris] installing the celeris package (editable) into %VENV%
"%PY%" -m pip install --disable-pip-version-check --no-deps -e .
if errorlevel 1 (
    echo [celeris] error: pip install -e . failed
    exit /b 1
)
exit /b 0
