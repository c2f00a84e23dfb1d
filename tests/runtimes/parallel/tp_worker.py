"""One tensor-parallel run, started by test_tensor_parallel.py in a subprocess: under torchrun (torch) or with
two forced host devices (jax). Prints one JSON line (rank 0 only under torchrun): the greedy tokens through the
generation runner, the `forward` logits, and the collectives one `forward` ran.

    python -m torch.distributed.run --nproc-per-node 2 tp_worker.py torch SOURCE FOLDER PROMPT N
    XLA_FLAGS=--xla_force_host_platform_device_count=2 python tp_worker.py jax SOURCE FOLDER PROMPT N
"""

from __future__ import annotations

import json
import re
import sys

import numpy as np


def main(backend: str, source: str, folder: str, prompt: str, n: int) -> None:
    from linnet.runtimes.generation import Generator
    from linnet.runtimes.sampling import SamplingParams

    prompt_ids = [int(t) for t in prompt.split(",")]
    ids = np.array([prompt_ids])
    if backend == "torch":
        import torch
        import torch.distributed as dist
        from torch.distributed.tensor.debug import CommDebugMode

        from linnet.runtimes.parallel.torch_tp import load_tensor_parallel

        torch.set_num_threads(1)
        model = load_tensor_parallel(source, folder, max_positions=64, progress=False)
        comms = CommDebugMode()
        with comms:
            logits = model.forward(ids)
        collectives = {str(op).split(".")[-1]: n for op, n in comms.get_comm_counts().items()}
        shards = {p: list(t.to_local().shape) for p, t in model.module.tensors.items()}
        rank, ranks = dist.get_rank(), dist.get_world_size()
    else:
        import jax

        from linnet.runtimes.parallel.jax_mesh import load_tensor_parallel

        model = load_tensor_parallel(source, folder, max_positions=64, progress=False)
        logits = model.forward(ids)
        hlo = model.functions["forward"].lower(model.params, {}, model.put_input(ids)).compile().as_text()
        collectives = {op: len(re.findall(rf"= \S+ {op}(-start)?\(", hlo)) for op in ("all-reduce", "all-gather")}
        shards = {p: list(a.addressable_shards[0].data.shape) for p, a in {**model.params, **model.state}.items()}
        rank, ranks = 0, jax.device_count()
    result = Generator(model.step_model(), None).generate(prompt_ids, SamplingParams(max_new_tokens=n))
    if rank == 0:
        out = {
            "ranks": ranks,
            "tokens": result.token_ids,
            "logits": np.asarray(logits).tolist(),
            "collectives": collectives,
            "shards": shards,
        }
        print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
