"""Started by test_tensor_parallel.py under torchrun (2 ranks): the process group from `init_mesh`, one
all-reduce, then rank 1 works on for `DELAY_S` while rank 0 is done. Each rank writes when it was done and, from a
handler that runs after Linnet's exit teardown, when its interpreter left, to OUT/rank{r}.json.

    python -m torch.distributed.run --standalone --nproc-per-node 2 teardown_worker.py OUT
"""

from __future__ import annotations

import atexit
import json
import sys
import time
from pathlib import Path

DELAY_S = 3.0


def main(out: Path) -> None:
    import torch
    import torch.distributed as dist

    from linnet.runtimes.parallel.torch_tp import init_mesh

    times: dict = {}
    # registered before init_mesh's teardown, so it runs after it (atexit runs last-registered first)
    atexit.register(lambda: (out / f"rank{rank}.json").write_text(json.dumps(times | {"left": time.time()})))
    init_mesh("cpu")
    rank = dist.get_rank()
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t.tolist() == [2.0] * 4
    if rank == 1:
        time.sleep(DELAY_S)  # a slower rank still finishing its work (its last collective, a print)
    times["done"] = time.time()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
