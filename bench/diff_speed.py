"""`linnet diff` wall time: writes bench/results/diff_speed.json.

Each row is the whole command in a fresh process (`python -m linnet diff FILE --weights W`: imports, Linnet's load,
the reference's load, every entry on both sides, the comparison), as a user runs it: SmolLM2-135M from the embedded
GGUF, and the shrunk checkpoints of the porting suite (tests/porting/checkpoints.py: seeded, 2 layers, saved with
`save_pretrained`). Beside each: the process's CPU seconds per wall second and the share of the time some task waited
for a CPU (/proc/pressure/cpu), since this machine's 2 cores are shared.

Goal (issue 40): under 20 s on a 2-layer shrunk model. Run: `python bench/diff_speed.py [--families llama,bert]`.
Timings live here, never in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import generate_speed as gs  # noqa: E402  (bench/ is not a package; stdlib-only at import time)

OUT = ROOT / "bench" / "results" / "diff_speed.json"
DEFAULT = "llama,gpt2,bert,vit,whisper,autoencoder_kl,unet_2d_condition"


def timed(argv: list[str]) -> dict:
    """One `linnet` process: exit status, wall seconds, CPU seconds per wall second, CPU wait %."""
    t0, p0 = time.perf_counter(), gs.cpu_pressure_us()
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "linnet", *argv], cwd=ROOT, capture_output=True, text=True)
    wall, p1 = time.perf_counter() - t0, gs.cpu_pressure_us()
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    wait = None if p0 is None or p1 is None else round(100 * (p1 - p0) / 1e6 / wall, 1)
    last = proc.stdout.strip().splitlines()[-1:] or proc.stderr.strip().splitlines()[-1:]
    return {"exit": proc.returncode, "wall_s": round(wall, 2), "cpu_per_wall": round(cpu / wall, 2),
            "cpu_wait_pct": wait, "summary": last[0] if last else ""}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=DEFAULT, help=f"shrunk families (default {DEFAULT})")
    parser.add_argument("--no-smollm2", action="store_true", help="skip the embedded SmolLM2 GGUF row")
    args = parser.parse_args()
    from tests.porting.checkpoints import FAMILIES, build, source

    rows = []
    if not args.no_smollm2:
        argv = ["diff", "examples/llama.linnet", "--weights", "smollm2-135m-instruct", "--preset", "smollm2_135m"]
        rows.append({"model": "llama", "checkpoint": "SmolLM2-135M-Instruct GGUF (30 layers)", **timed(argv)})
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families.split(","):
            folder = Path(tmp) / family
            build(family, folder)
            argv = ["diff", str(source(family)), "--weights", str(folder), "--reference", FAMILIES[family][0]]
            rows.append({"model": family, "checkpoint": "seeded 2-layer (tests/porting)", **timed(argv)})
            print(rows[-1], file=sys.stderr)
    written = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    record = {"written": written, "machine": gs.machine(), "loadavg": os.getloadavg(),
              "what": "`linnet diff` in a fresh process, wall time", "rows": rows}  # fmt: skip
    OUT.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
