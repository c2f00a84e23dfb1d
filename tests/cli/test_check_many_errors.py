"""`linnet check` on a big file with thousands of errors stays linear (issue 45 item 3): each error's excerpt reads
its line from the source split once, not re-split per error, and did-you-mean suggestions skip, without computing
a distance, the candidates whose lengths or characters put them out of reach. Timings live in bench/, not here:
these tests count the work."""

from __future__ import annotations

from linnet.semantics import render, suggest
from linnet.semantics.program import Document


def _many_errors(n: int) -> str:
    item = "fn helper_{i}(x: f32[B, D]) -> f32[B, D] {{\n    let y = x + missing_{i}\n    y\n}}\n\n"
    return "".join(item.format(i=i) for i in range(n))


def test_rendering_splits_a_source_once_for_all_its_errors(monkeypatch):
    text = _many_errors(200)
    analysis = Document("/tmp/many.linnet", text).analyze()
    assert len(analysis.diagnostics) == 200
    splits = []
    real = render.split_lines
    monkeypatch.setattr(render, "split_lines", lambda t, *a: splits.append(len(t)) or real(t, *a))
    render._lines_of.cache_clear()
    out = [render.render_text(d, {"/tmp/many.linnet": text}.get) for d in analysis.diagnostics]
    assert "let y = x + missing_199" in out[-1]
    assert len(splits) == 1, f"the source was split {len(splits)} times for 200 errors"


def test_suggestions_compute_no_distance_for_candidates_out_of_reach(monkeypatch):
    calls = []
    real = suggest.edit_distance
    monkeypatch.setattr(suggest, "edit_distance", lambda *a, **k: calls.append(a) or real(*a, **k))
    candidates = [f"helper_{i}" for i in range(5000)] + ["missing_count"]
    assert suggest.suggestions("missing_cont", candidates) == ["missing_count"]
    assert len(calls) < 50, f"{len(calls)} distances computed among {len(candidates)} candidates"


def _configs_and_presets(n: int) -> str:
    """`n` configs, each with two presets and a module that takes it (and one unknown name, the same in each)."""
    item = (
        "config C{i} {{\n    width: int = 8\n    depth: int = 2\n}}\n\n"
        "preset small_{i} = C{i} {{ width = 4 }}\n\npreset large_{i} = C{i} {{ width = 16 }}\n\n"
        "module M{i}(c: C{i}) {{\n    fn forward(x: f32[B, c.width]) -> f32[B, c.width] {{\n"
        "        x + missng\n    }}\n}}\n\n"
    )
    return "".join(item.format(i=i) for i in range(n))


def test_scenarios_walk_each_config_value_once(monkeypatch):
    """Every preset's scenario holds every config (at its defaults but one): the values each config reaches were
    walked field by field once per scenario and config (quadratic in a file's configs; with list scans per scenario
    name, cubic), and are now walked once per value."""
    from linnet.semantics import configs

    walked = []
    real = configs.ConfigValue.field_def
    monkeypatch.setattr(configs.ConfigValue, "field_def", lambda self, name: walked.append(name) or real(self, name))
    seen = {}
    real_values = configs.values_by_type

    def counting(scenarios, lookup):
        walked.clear()
        out = real_values(scenarios, lookup)
        seen["walked"] = len(walked)
        return out

    monkeypatch.setattr("linnet.semantics.program.values_by_type", counting)
    n = 40
    analysis = Document("/tmp/configs.linnet", _configs_and_presets(n)).analyze()
    assert len(analysis.scenarios) == 2 * n + 1
    assert seen["walked"] <= 2 * 3 * n + 20, f"{seen['walked']} fields walked for {3 * n} config values"
    # each module is still checked under its config's three values, each error reported once
    assert sum(1 for d in analysis.diagnostics if d.code == "L101") == n


def test_an_unknown_name_is_looked_up_among_the_top_level_names_once(monkeypatch):
    """The same unknown name in many items, each checked under several presets, searched every top-level name's
    group each time; the search is now remembered per name for the namespace."""
    calls = []
    real = suggest.NameIndex.near
    monkeypatch.setattr(suggest.NameIndex, "near", lambda self, name: calls.append(name) or real(self, name))
    analysis = Document("/tmp/configs.linnet", _configs_and_presets(30)).analyze()
    errors = [d for d in analysis.diagnostics if d.code == "L101"]
    assert len(errors) == 30 and "did you mean" not in errors[0].message
    assert calls == ["missng"], f"{len(calls)} searches of the top-level names for one unknown name"


def test_an_unknown_name_is_matched_once_for_all_the_configs_of_its_module(monkeypatch):
    """A module is checked once per config (llama.linnet: its defaults and four presets), and an unknown name in it
    asked for did-you-mean suggestions among the same names under each: `siluu` was measured against `silu` six
    times (five searches of the module's names, one of the top-level names), now twice."""
    from collections import Counter

    from tests.conftest import EXAMPLES

    llama = (EXAMPLES / "llama.linnet").read_text(encoding="utf-8")
    text = llama.replace("    down_proj(silu(", "    down_proj(siluu(")
    distances = []
    real = suggest.edit_distance
    monkeypatch.setattr(suggest, "edit_distance", lambda a, b, *r: distances.append((a, b)) or real(a, b, *r))
    suggest._suggestions.cache_clear()
    analysis = Document("/tmp/typo.linnet", text).analyze()
    assert len(analysis.items[next(i for i in analysis.items if i.name == "LlamaMLP")].results) == 5
    (typo,) = [d for d in analysis.diagnostics if d.code == "L101"]
    assert typo.message == "unknown name `siluu`; did you mean `silu`?" and typo.presets is None
    asked = Counter(pair for pair in distances if pair[0] == "siluu")
    assert asked[("siluu", "silu")] == 2, f"distances computed per config: {asked}"


def test_config_values_are_recorded_against_scenarios_without_visiting_each_scenarios_every_config(monkeypatch):
    """A preset's scenario replaces one config's defaults (`Scenario.changed`): the other configs' values are
    recorded against it without being visited (570 configs and 2,280 presets: 1.3 million visits, ~1.5 s before
    the checks began). The values and their scenarios, in order, are those of visiting every scenario's every
    config (`changed` unknown), nested values and `none` fields included."""
    import dataclasses

    from linnet.semantics import configs

    nested = (
        "config Scaling {\n    factor: int = 2\n}\n\n"
        "config Outer {\n    inner: Scaling = Scaling {}\n    maybe: Scaling? = none\n}\n\n"
        "preset scaled = Outer { inner = Scaling { factor = 4 } }\n\n"
        "preset maybe = Outer { maybe = Scaling {} }\n\n"
        "preset same = Outer { inner = Scaling { factor = 2 } }\n\n"
    )
    analysis = Document("/tmp/configs.linnet", nested + _configs_and_presets(30)).analyze()
    walks = []

    class Walked(dict):
        """A scenario's configs, counting the walks over them."""

        def values(self):
            walks.append(self)
            return super().values()

        def items(self):
            walks.append(self)
            return super().items()

    scenarios = [dataclasses.replace(s, configs=Walked(s.configs)) for s in analysis.scenarios]
    fast = configs.values_by_type(scenarios, analysis.globals)
    fast_walks = len(walks)
    walks.clear()
    full = configs.values_by_type([dataclasses.replace(s, changed=None) for s in scenarios], analysis.globals)
    assert len(scenarios) == 1 + 3 + 2 * 30
    assert {t: [(id(v), n, own) for v, n, own in vs] for t, vs in fast.items()} == {
        t: [(id(v), n, own) for v, n, own in vs] for t, vs in full.items()
    }
    assert list(fast) == list(full)
    assert fast_walks <= 2 and len(walks) == len(scenarios)  # the first scenario's configs only


def test_a_binding_keeps_its_own_scenarios_without_scanning_every_scenario_name(monkeypatch):
    """A module's binding under its config's defaults occurs in every scenario that leaves that config at its
    defaults (every other config's presets: 2,280 names in the 5 MB document) and keeps only those whose own
    configs reach it (`defaults`): each such binding scanned all those names (2,850 items: 5 % of the check). Now
    the few kept names are looked up in the list; the names each binding keeps, in order, are the same."""
    from linnet.semantics import program

    iterated = []

    class Names(list):
        """A value's scenario names, counting the names read one by one."""

        def __iter__(self):
            iterated.append(len(self))
            return super().__iter__()

    real_values = program.values_by_type
    monkeypatch.setattr(
        program,
        "values_by_type",
        lambda s, g: {t: [(v, Names(n), own) for v, n, own in vs] for t, vs in real_values(s, g).items()},
    )
    real_compute = program.Document._compute_bindings
    kept = {}

    def compute(self, item, values, globals_):
        iterated.clear()
        out = real_compute(self, item, values, globals_)
        kept[item.name] = ([list(names) for _, _, names in out], sum(iterated))
        return out

    monkeypatch.setattr(program.Document, "_compute_bindings", compute)
    n = 40
    Document("/tmp/configs.linnet", _configs_and_presets(n)).analyze()
    assert kept["M7"][0] == [["defaults"], ["small_7"], ["large_7"]]
    scanned = max(count for _, count in kept.values())
    assert scanned < 10, f"a module's bindings read {scanned} scenario names one by one ({2 * n + 1} scenarios)"


def test_a_config_values_origins_are_walked_once_it_is_evaluated():
    """Every instance, signature and binding key of a check holds its config values' origins
    (`ConfigValue.origins_key`): each walked the value's fields again (76,000 walks in the 5 MB document). An
    evaluated value keeps its key; the key is the one a walk makes, nested values' origins included."""
    nested = (
        "config Scaling {\n    factor: int = 2\n}\n\n"
        "config Outer {\n    inner: Scaling = Scaling {}\n    width: int = 8\n}\n\n"
        "preset scaled = Outer { inner = Scaling { factor = 4 } }\n\n"
    )
    analysis = Document("/tmp/configs.linnet", nested).analyze()
    value = next(s.configs["Outer"] for s in analysis.scenarios if s.name == "scaled")
    reads = []

    class Origins(dict):
        """The value's origins, counting the reads."""

        def get(self, *a):
            reads.append(a[0])
            return super().get(*a)

    value.origins = Origins(value.origins)
    first = value.origins_key()
    assert value.origins_key() is first and reads == [], f"the origins were read again: {reads}"
    inner = value.values["inner"]
    assert first == (("inner", value.origins["inner"], inner.origins_key()), ("width", value.origins["width"], None))
    assert inner.origins_key()[0][1] != next(s.configs["Scaling"] for s in analysis.scenarios).origins_key()[0][1]
