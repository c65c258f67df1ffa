#!/usr/bin/python3
"""The code-interpreter-v1 server on port 49999: what E2B's Code Interpreter
SDK (@e2b/code-interpreter) calls, backed by Jupyter kernels.

  GET    /health                 200 once the default Python kernel is ready
  POST   /execute                {code, context_id?, language?, env_vars?}: the
                                 execution's events as JSON lines, streamed
  POST   /contexts               {language?, cwd?} -> {id, language, cwd}
  GET    /contexts               the contexts
  POST   /contexts/<id>/restart  a new kernel for the context (state dropped)
  DELETE /contexts/<id>          shuts the context's kernel down

Events (one JSON object a line): stdout / stderr {text}, result {text, html,
markdown, svg, png, jpeg, pdf, latex, json, javascript, is_main_result},
error {name, value, traceback}, number_of_executions {execution_count},
end_of_execution.

A Python context is an ipykernel of its own (jupyter_client's KernelManager),
started in the context's working directory, with matplotlib's inline backend
(figures come back as image/png results). Env vars of an execution are set in
the kernel's os.environ for that execution only. A client that goes away
before the end (the SDK's timeout aborts its request) interrupts the kernel
(SIGINT: KeyboardInterrupt in the cell).

Debian packages no bash or JavaScript kernel, so bash and JavaScript contexts
run each cell as a process of its own (bash -c, node -e) in the context's
working directory: output is streamed, a non-zero exit is an error, no state
is kept from one cell to the next.

Only the standard library and jupyter_client are used.
"""

import json
import os
import queue
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from jupyter_client.manager import KernelManager

PORT = 49999
DEFAULT_CWD = "/home/user"

# Run silently in every new Python kernel: inline figures as PNG.
KERNEL_SETUP = "%matplotlib inline\n"

# MIME types of Jupyter display data and the result fields the SDK reads.
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}

LANGUAGES = {
    None: "python", "": "python", "python": "python", "python3": "python", "py": "python",
    "bash": "bash", "sh": "bash", "shell": "bash",
    "js": "javascript", "javascript": "javascript", "node": "javascript", "nodejs": "javascript",
}


def log(*args):
    print(time.strftime("%H:%M:%S"), *args, file=sys.stderr, flush=True)


class ClientGone(Exception):
    """The HTTP client closed its connection during an execution."""


class Context:
    """One execution context: a Python kernel, or a directory and a language
    whose cells run as processes. Executions in a context run one at a time."""

    def __init__(self, language, cwd):
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd or DEFAULT_CWD
        self.lock = threading.Lock()
        self.km = None
        self.kc = None
        if language == "python":
            self.start_kernel()

    def describe(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def start_kernel(self):
        env = dict(os.environ)
        env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # no debugger warning per kernel start
        env.setdefault("HOME", DEFAULT_CWD)
        os.makedirs(self.cwd, exist_ok=True)
        km = KernelManager(kernel_name="python3")
        km.start_kernel(cwd=self.cwd, env=env)
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=900)
        self.km, self.kc = km, kc
        self.run_silent(KERNEL_SETUP)
        log("context", self.id, "kernel ready in", self.cwd)

    def stop_kernel(self):
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km is not None:
            self.km.shutdown_kernel(now=True)
        self.km = self.kc = None

    def restart(self):
        with self.lock:
            if self.language == "python":
                self.stop_kernel()
                self.start_kernel()

    def run_silent(self, code):
        """Runs code in the kernel without output or history; waits for it."""
        msg_id = self.kc.execute(code, silent=True, store_history=False)
        while True:
            msg = self.kc.get_shell_msg(timeout=900)
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg["content"]

    def execute(self, code, env_vars, emit, gone):
        with self.lock:
            if self.language == "python":
                self.execute_python(code, env_vars or {}, emit, gone)
            else:
                self.execute_process(code, env_vars or {}, emit, gone)

    def execute_python(self, code, env_vars, emit, gone):
        if env_vars:
            self.run_silent("import os as _aenv_os\n_aenv_saved_env = {k: _aenv_os.environ.get(k) for k in %r}\n"
                            "_aenv_os.environ.update(%r)\n" % (list(env_vars), dict(env_vars)))
        try:
            self.stream_kernel(self.kc.execute(code, store_history=True, allow_stdin=False), emit, gone)
        finally:
            if env_vars:
                self.run_silent("for _k, _v in _aenv_saved_env.items():\n"
                                "    _aenv_os.environ.pop(_k, None) if _v is None else _aenv_os.environ.__setitem__(_k, _v)\n"
                                "del _aenv_saved_env\n")

    def stream_kernel(self, msg_id, emit, gone):
        """Turns the kernel's iopub messages of msg_id into events until the
        kernel is idle again; interrupts the kernel if the client goes."""
        interrupted = False
        while True:
            if not interrupted and gone():
                log("context", self.id, "client gone: interrupting the kernel")
                self.km.interrupt_kernel()
                interrupted = True
            try:
                msg = self.kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                if not self.km.is_alive():
                    emit({"type": "error", "name": "KernelDied", "traceback": "",
                          "value": "the kernel exited during the execution; restart the context"})
                    return
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                emit({"type": content["name"], "text": content["text"]})
            elif kind in ("execute_result", "display_data"):
                emit(result_event(content.get("data", {}), kind == "execute_result"))
            elif kind == "error":
                emit({"type": "error", "name": content.get("ename", ""), "value": content.get("evalue", ""),
                      "traceback": "\n".join(content.get("traceback", []))})
            elif kind == "execute_input":
                emit({"type": "number_of_executions", "execution_count": content.get("execution_count")})
            elif kind == "status" and content.get("execution_state") == "idle":
                break
        # The shell reply of msg_id (dropped; its status came as iopub).
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                reply = self.kc.get_shell_msg(timeout=1)
            except queue.Empty:
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        if interrupted:
            raise ClientGone()

    def execute_process(self, code, env_vars, emit, gone):
        if self.language == "bash":
            argv = ["/bin/bash", "-c", code]
        else:
            node = shutil.which("node") or shutil.which("nodejs")
            if node is None:
                emit({"type": "error", "name": "NotSupported", "value": "JavaScript needs Node.js, which is not installed",
                      "traceback": ""})
                return
            argv = [node, "-e", code]
        env = dict(os.environ)
        env.update(env_vars)
        os.makedirs(self.cwd, exist_ok=True)
        proc = subprocess.Popen(argv, cwd=self.cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        streams = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr"}
        while streams:
            if gone():
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise ClientGone()
            ready, _, _ = select.select(list(streams), [], [], 0.5)
            for fd in ready:
                data = os.read(fd, 65536)
                if not data:
                    del streams[fd]
                else:
                    emit({"type": streams[fd], "text": data.decode("utf-8", "replace")})
        code = proc.wait()
        if code != 0:
            emit({"type": "error", "name": "ExitError", "value": "%s exited with code %d" % (self.language, code),
                  "traceback": ""})


def result_event(data, main):
    ev = {"type": "result", "is_main_result": main}
    for mime, value in data.items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            ev.setdefault("extra", {})[mime] = value
        else:
            ev[field] = value
    return ev


class Contexts:
    """The server's contexts; one default context per language, made on first use."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_id = {}
        self.defaults = {}
        self.making = threading.Lock()
        self.ready = threading.Event()

    def create(self, language, cwd):
        ctx = Context(language, cwd)
        with self.lock:
            self.by_id[ctx.id] = ctx
        return ctx

    def default(self, language):
        # One maker at a time: two first executions (or one and the warm-up)
        # must not each start a kernel.
        with self.making:
            with self.lock:
                ctx = self.defaults.get(language)
            if ctx is None:
                ctx = self.create(language, DEFAULT_CWD)
                with self.lock:
                    self.defaults[language] = ctx
            return ctx

    def get(self, cid):
        with self.lock:
            return self.by_id.get(cid)

    def remove(self, cid):
        with self.lock:
            ctx = self.by_id.pop(cid, None)
            for lang, d in list(self.defaults.items()):
                if d is ctx:
                    del self.defaults[lang]
        if ctx is not None:
            with ctx.lock:
                ctx.stop_kernel()
        return ctx

    def list(self):
        with self.lock:
            return [c.describe() for c in self.by_id.values()]


CONTEXTS = Contexts()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        log(self.address_string(), fmt % args)

    def reply(self, status, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def fail(self, status, message):
        self.reply(status, {"error": message})

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n == 0:
            return {}
        try:
            v = json.loads(self.rfile.read(n))
        except ValueError as e:
            raise ValueError("request body is not JSON: %s" % e)
        if not isinstance(v, dict):
            raise ValueError("request body is not a JSON object")
        return v

    def path_parts(self):
        return [p for p in self.path.split("?", 1)[0].split("/") if p]

    def do_GET(self):
        parts = self.path_parts()
        if parts == ["health"]:
            if CONTEXTS.ready.is_set():
                self.reply(200, {"status": "ok"})
            else:
                self.fail(503, "the default kernel is starting")
        elif parts == ["contexts"]:
            self.reply(200, CONTEXTS.list())
        else:
            self.fail(404, "no such path: " + self.path)

    def do_DELETE(self):
        parts = self.path_parts()
        if len(parts) == 2 and parts[0] == "contexts":
            if CONTEXTS.remove(parts[1]) is None:
                self.fail(404, "context %s not found" % parts[1])
            else:
                self.reply(204)
        else:
            self.fail(404, "no such path: " + self.path)

    def do_POST(self):
        parts = self.path_parts()
        try:
            req = self.body()
        except ValueError as e:
            self.fail(400, str(e))
            return
        if parts == ["execute"]:
            self.execute(req)
        elif parts == ["contexts"]:
            lang = LANGUAGES.get(req.get("language"))
            if lang is None:
                self.fail(400, "unsupported language %r (python, bash or javascript)" % req.get("language"))
                return
            try:
                ctx = CONTEXTS.create(lang, req.get("cwd"))
            except Exception as e:  # a kernel that does not start
                self.fail(500, "create context: %s" % e)
                return
            self.reply(200, ctx.describe())
        elif len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart":
            ctx = CONTEXTS.get(parts[1])
            if ctx is None:
                self.fail(404, "context %s not found" % parts[1])
                return
            ctx.restart()
            self.reply(204)
        else:
            self.fail(404, "no such path: " + self.path)

    def execute(self, req):
        code = req.get("code")
        if not isinstance(code, str):
            self.fail(400, "code (a string) is required")
            return
        env_vars = req.get("env_vars") or {}
        if not isinstance(env_vars, dict) or not all(isinstance(v, str) for v in env_vars.values()):
            self.fail(400, "env_vars must map names to strings")
            return
        if req.get("context_id"):
            ctx = CONTEXTS.get(req["context_id"])
            if ctx is None:
                self.fail(404, "context %s not found" % req["context_id"])
                return
        else:
            lang = LANGUAGES.get(req.get("language"))
            if lang is None:
                self.fail(400, "unsupported language %r (python, bash or javascript)" % req.get("language"))
                return
            ctx = CONTEXTS.default(lang)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            ctx.execute(code, env_vars, self.emit, self.client_gone)
            self.emit({"type": "end_of_execution"})
            self.wfile.write(b"0\r\n\r\n")
        except (ClientGone, BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def emit(self, event):
        line = json.dumps(event).encode() + b"\n"
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()
        except OSError:
            raise ClientGone()

    def client_gone(self):
        """Whether the client closed its side (readable with nothing to read)."""
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if not r:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True


def main():
    server = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
    server.daemon_threads = True

    def warm():
        CONTEXTS.default("python")
        CONTEXTS.ready.set()

    threading.Thread(target=warm, daemon=True).start()
    log("code interpreter listening on port", PORT)
    server.serve_forever()


if __name__ == "__main__":
    main()
