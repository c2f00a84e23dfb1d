"""The PyTorch backend's liveness pass (`linnet/compiler/torch/liveness.py`): each intermediate freed after its last
use,
never a name that some path leaves unbound, and the generated model still computing the same values."""

from __future__ import annotations

import weakref

from linnet.compiler.torch.liveness import release_dead_values

SOURCE = '''\
    def f(self, x, make):
        """a chain, a loop and a branch"""
        a = make("a", x)  # a comment
        b = make("b", a)
        for _ in range(2):
            b = make("b", b)
        if x:
            c = make("c", b)
        else:
            c = make("c", a)
            unbound_elsewhere = make("u", c)
        d = make("d", c, unbound_elsewhere if not x else None)
        e = make("e", d)
        return e'''


class Events:
    """`make(tag, *inputs)` returns a new object and records when each is made and freed."""

    def __init__(self):
        self.log: list[str] = []

    def make(self, tag, *inputs):
        class Obj:
            pass

        obj = Obj()
        self.log.append(f"made {tag}")
        weakref.finalize(obj, self.log.append, f"freed {tag}")
        return obj


def run(lines: list[str], x: bool) -> list[str]:
    ns: dict = {}
    exec("\n".join(line[4:] for line in lines), ns)  # a method's text, dedented one level
    events = Events()
    ns["f"](None, x, events.make)
    return events.log


def test_each_intermediate_is_freed_after_its_last_read():
    lines = SOURCE.splitlines()
    out = release_dead_values(lines, tensors={"a", "b", "c", "d", "e", "unbound_elsewhere"})
    added = [line.strip() for line in out if line not in lines]
    # `a` is read last by the `if`; `b` by it too; `c` only bound in branches: never deleted; `d` is read by the
    # statement before the return (returning frees it as soon)
    assert added == ["del a, b"]
    assert out[out.index("        del a, b") - 1].strip() == 'unbound_elsewhere = make("u", c)'
    for x in (True, False):
        before, after = run(lines, x), run(out, x)
        assert [e for e in before if e.startswith("made")] == [e for e in after if e.startswith("made")]
        # freed before `d` is made, where without the pass they live until the function returns
        assert after.index("freed a") < after.index("made d") and before.index("freed a") > before.index("made e")


def test_parameters_and_names_outside_the_tensors_are_kept():
    lines = SOURCE.splitlines()
    out = release_dead_values(lines, tensors={"x", "make", "b"})
    assert [line.strip() for line in out if line not in lines] == ["del b"]


def test_generated_model_frees_its_intermediates():
    """The SmolLM2-shaped generated step: its layer methods `del` what they no longer read (the names of the
    generated text), and the text runs (the parity tests check its values)."""
    from linnet.compiler.torch.codegen import generate
    from linnet.ir import build
    from tests.conftest import EXAMPLES

    source = generate(build(EXAMPLES / "llama.linnet", config=dict(num_hidden_layers=1, hidden_size=32,
                      intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=64)))  # fmt: skip
    mlp = source[source.index("class LlamaMLP") :]
    mlp = mlp[: mlp.index("return down_proj")]
    assert "del silu, up_proj" in mlp and "del gate_proj" in mlp
    compile(source, "generated", "exec")
