"""What `linnet run`'s file inputs (`--image x.png`, `--audio x.wav`) share: the entry argument each fills, found by
name (the zoo's contract, transformers' names: `pixel_values`, `input_features`), the entry's dim variables sized
from the file's tensor. `linnet.cli.image` and `linnet.cli.audio` read and preprocess the files."""

from __future__ import annotations

# the flag (argparse's dest) -> the entry argument its file fills
FILE_ARGUMENTS = {"image": "pixel_values", "audio": "input_features"}


def requested(args) -> dict[str, str]:
    """The file flags given (`{"audio": "input_features"}`), in FILE_ARGUMENTS' order."""
    return {flag: name for flag, name in FILE_ARGUMENTS.items() if getattr(args, flag, None) is not None}


def entry_graph(args, program):
    """The IR graph of the entry `linnet run` runs (`--entry`, else the program's first). Raises ValueError for an
    entry the program lacks, naming its entries."""
    entry = args.entry or next(iter(program.entries))
    if entry not in program.entries:
        raise ValueError(f"no entry `{entry}` (entries: {', '.join(program.entries)})")
    return program.entries[entry]


def check_arguments(args, graph) -> None:
    """Refuse file flags whose argument entry `graph` does not take, before any file is read: one flag names its
    argument (`--audio: entry `forward` takes no `input_features` (its inputs: x)`), several say that it takes
    none of theirs. Raises ValueError."""
    taken = {v.name for v in graph.inputs}
    missing = {flag: name for flag, name in requested(args).items() if name not in taken}
    if not missing:
        return
    inputs = ", ".join(v.name for v in graph.inputs) or "none"
    flags = " and ".join(f"--{flag}" for flag in missing)
    if len(missing) == 1:
        what = f"takes no `{next(iter(missing.values()))}`"
    else:
        what = "takes neither " + " nor ".join(f"`{name}`" for name in missing.values())
    raise ValueError(f"{flags}: entry `{graph.name}` {what} (its inputs: {inputs})")


def target(graph, flag: str, rank: int):
    """Entry `graph`'s input that `--flag` fills (checked present by `check_arguments`). Raises ValueError when its
    rank is not `rank`."""
    name = FILE_ARGUMENTS[flag]
    value = next(v for v in graph.inputs if v.name == name)
    if len(value.dims) != rank:
        raise ValueError(f"--{flag}: `{name}` of entry `{graph.name}` has rank {len(value.dims)}, not {rank}")
    return value


def size_dims(args, value, shape: tuple[int, ...]) -> None:
    """Set the sizes of the dim variables that are whole dims of input `value` from the file's tensor `shape`:
    `B` as `args.batch`, `S` as `args.seq`, any other as `--dim NAME=SIZE` (replacing one given), so the other
    random inputs are made to match. A fixed or computed dim (ViT's 224, Whisper's `2 * max_source_positions`)
    is left to the run, which refuses a size that differs, naming both."""
    from linnet.types.dims import dim_variables, format_dim

    dims = list(args.dim or [])
    for d, size in zip(value.dims, shape):
        names = dim_variables(d)
        if len(names) == 1 and format_dim(d) == next(iter(names)):
            name = next(iter(names))
            if name == "B":
                args.batch = size
            elif name == "S":
                args.seq = size
            else:
                dims = [item for item in dims if item.partition("=")[0].strip() != name] + [f"{name}={size}"]
    args.dim = dims
