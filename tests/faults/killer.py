"""`python -m tests.faults.killer ARGS...`: the cascade CLI, which SIGKILLs itself right after upload number
$CASCADE_KILL_AT_UPLOAD has landed, while the other upload threads are mid-transfer and before the manifest:
the worst moment for a checkpoint writer, which a random-time kill rarely hits. Test-only: production code has
no such hook."""

import itertools
import os
import signal
import threading

from cascade.artifacts.store import Store

AT = int(os.environ["CASCADE_KILL_AT_UPLOAD"])
_count, _lock = itertools.count(1), threading.Lock()
_real_put = Store.put_file


def _put_then_maybe_die(self, local, key):
    _real_put(self, local, key)
    with _lock:
        n = next(_count)
    if n == AT:
        os.kill(os.getpid(), signal.SIGKILL)


Store.put_file = _put_then_maybe_die

if __name__ == "__main__":
    from cascade.flows.cli import main

    main()
