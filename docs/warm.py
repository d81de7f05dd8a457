"""A warm ``attnlab`` for the pages' bash blocks: the same command, without importing torch again.

Every ``attnlab`` command a page runs is a new process that spends 2-3 s importing torch and
``torch._dynamo`` (which torch's optimizers import) before it does anything; a tiny run
then takes a fraction of a second. :func:`warm_attnlab` starts one server process that has
imported them once (and attnlab's command line and matplotlib), and puts a small ``attnlab``
script first on the blocks' ``PATH``. The script hands the server its arguments, folder,
environment and its stdin / stdout / stderr; the server forks, and the child runs
``attnlab.cli.main`` with exactly those, exits as the command would (its exit code, its
``atexit`` work), and the script exits with that code. The command is the same code on the
same input; only the imports are shared. Where the server is gone, the script runs the real
``attnlab``.

The server runs no torch operation before it forks (OpenMP's threads would not survive a
fork), and forks a fresh child per command, so no command sees another's state.

``ATTNLAB_DOCS_COLD=1`` turns it off (every command a fresh process, as a reader runs it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path

BIN = Path(sys.executable).parent
HEADER = 8  # bytes of the request's length, big-endian

# The script a page's `attnlab` runs: as small as Python starts (-S: no site packages).
CLIENT = '''#!{python} -S
import json, os, socket, sys
real = {real!r}
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["ATTNLAB_WARM"])
except (KeyError, OSError):
    os.execv(real, [real] + sys.argv[1:])
msg = json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
socket.send_fds(s, [len(msg).to_bytes({header}, "big")], [0, 1, 2])
s.sendall(msg)


def read4():
    data = b""
    while len(data) < 4:
        part = s.recv(4 - len(data))
        if not part:
            sys.exit("attnlab (warm): the server ended before the command did")
        data += part
    return int.from_bytes(data, "big", signed=True)


import signal
pid = read4()  # the command's process: a signal sent to this script goes on to it
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(sig, lambda number, frame: os.kill(pid, number))
sys.exit(read4())
'''


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = conn.recv(n - len(data))
        if not part:
            raise ConnectionError("the client went away")
        data += part
    return data


def _run_command(request: dict, fds: list[int]) -> int:
    """In the forked child: become the command's process, run it, return its exit code."""
    import io

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # the standard streams as a new Python process makes them for these file descriptors
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)),
                                  line_buffering=os.isatty(1))
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                                  errors="backslashreplace", line_buffering=True)
    sys.argv = [str(BIN / "attnlab"), *request["argv"]]
    try:
        from attnlab.cli import main

        code = main()
    except SystemExit as e:
        code = e.code
    except BaseException:  # as the interpreter reports an uncaught exception
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    return code


def _finish(code: int) -> None:
    import atexit

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _serve_one(conn: socket.socket) -> None:
    """In a child of the server: fork the command, wait for it, send its exit code back."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    head, fds, _, _ = socket.recv_fds(conn, HEADER, 3)
    head += _recv_exact(conn, HEADER - len(head))
    request = json.loads(_recv_exact(conn, int.from_bytes(head, "big")))
    pid = os.fork()
    if pid == 0:
        conn.close()
        code = 1
        try:
            code = _run_command(request, fds)
        finally:
            _finish(code)
    for fd in fds:
        os.close(fd)
    with contextlib.suppress(OSError):
        conn.sendall(pid.to_bytes(4, "big", signed=True))
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    with contextlib.suppress(OSError):
        conn.sendall(code.to_bytes(4, "big", signed=True))
    os._exit(0)


def serve(path: str) -> None:
    """The server: import once, then fork a child per connection (``python warm.py PATH``)."""
    import matplotlib.pyplot  # noqa: F401  (Agg: MPLBACKEND)
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401

    import attnlab.cli  # noqa: F401
    import attnlab.train  # noqa: F401

    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(64)
    server.settimeout(2.0)
    parent = os.getppid()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the children reap themselves
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            if os.getppid() != parent:  # the process that started it is gone (killed)
                shutil.rmtree(Path(path).parent, ignore_errors=True)
                return
            continue
        conn.settimeout(None)
        if os.fork() == 0:
            server.close()
            try:
                _serve_one(conn)
            finally:
                os._exit(1)
        conn.close()


@contextlib.contextmanager
def warm_attnlab(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """A server started with ``env``; inside, the variables that send a block's ``attnlab``
    to it (``PATH`` with the script first, ``ATTNLAB_WARM``). Nothing changes where
    ``ATTNLAB_DOCS_COLD`` is set, or the server does not start."""
    if os.environ.get("ATTNLAB_DOCS_COLD") or not hasattr(socket, "send_fds") \
            or not (BIN / "attnlab").exists():
        yield {}
        return
    folder = Path(tempfile.mkdtemp(prefix="attnlab-warm-"))
    path = str(folder / "socket")
    client = folder / "bin" / "attnlab"
    client.parent.mkdir()
    client.write_text(CLIENT.format(python=sys.executable, real=str(BIN / "attnlab"),
                                    header=HEADER))
    client.chmod(0o755)
    proc = subprocess.Popen([sys.executable, __file__, path], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        ready = proc.stdout.readline().strip() == b"ready"
        yield {"ATTNLAB_WARM": path,
               "PATH": f"{client.parent}{os.pathsep}{env.get('PATH', os.environ['PATH'])}"
               } if ready else {}
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    serve(sys.argv[1])
