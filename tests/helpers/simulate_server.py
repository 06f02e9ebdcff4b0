"""A warm parent for the simulator tests: imports torch, torch_neuronx and the simulator once, then
runs each `python -m torch_neuronx.simulate ARGS` request in a forked child, as a fresh process
would (its own environment, stdout and stderr files, exit status), without paying the imports again.

Protocol: one JSON line per request on stdin, {"argv": [...], "env": {...}, "stdout": path,
"stderr": path}; one JSON line per answer on stdout, {"returncode": n}."""
import json
import os
import signal
import sys

import torch  # noqa: F401  (the point: loaded once)
import torch.distributed.fsdp  # noqa: F401
import torch.distributed.tensor.parallel  # noqa: F401
import torch.testing._internal.distributed.fake_pg  # noqa: F401
import torch._dynamo  # noqa: F401

from torch_neuronx.simulate.__main__ import main


def serve():
    answers = os.fdopen(os.dup(1), "w")
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.alarm(600)  # a run that hangs dies (SIGALRM) instead of hanging the tests
                os.environ.update(request["env"])
                for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
                    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                    os.dup2(target, fd)
                sys.stdout = os.fdopen(1, "w", buffering=1)
                sys.stderr = os.fdopen(2, "w", buffering=1)
                code = main(request["argv"])
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
            except BaseException:  # noqa: BLE001 - reported like an uncaught exception
                import traceback
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve()
