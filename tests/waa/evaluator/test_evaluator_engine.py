"""evaluate_task: WAA's evaluate() order, conjunctions, infeasible tasks and the error policy."""

from __future__ import annotations

import pytest

from adapters.waa.evaluator import KNOWN_DEVIATIONS, METRICS, metric
from adapters.waa.evaluator.engine import EvaluationOutcome

DOCS = r"C:\Users\Docker\Documents"


def rule(value):
    return {"type": "rule", "rules": {"expected": value}}


def val(value):
    """A result getter that yields `value` itself."""
    return {"type": "rule", "rules": value}


def exact(result_spec, expected_value):
    return {"func": "exact_match", "result": result_spec, "expected": rule(expected_value)}


# -- single metric ---------------------------------------------------------------------------------


def test_exact_match_scores_and_explains(evaluate):
    out = evaluate(exact({"type": "rule", "rules": 1.0}, 1.0))
    assert (out.score, out.kind) == (1.0, "scored")
    out = evaluate(exact({"type": "rule", "rules": 0.0}, 1.0))
    assert (out.score, out.kind) == (0.0, "scored")
    assert out.reason == "exact_match: result 0.0 != expected 1.0"
    assert out.details[0]["func"] == "exact_match"
    assert out.details[0]["score"] == 0.0


def test_type_mismatch_is_a_zero(evaluate):
    assert evaluate(exact({"type": "rule", "rules": "7"}, 7)).score == 0.0
    assert evaluate(exact({"type": "rule", "rules": True}, 1)).score == 1.0


def test_options_are_passed_as_keyword_arguments(evaluate, vm, tmp_path):
    vm.files[DOCS + r"\a.txt"] = b"HELLO"
    gold = tmp_path / "cache" / "gold.txt"  # cache_file names a file in the task's cache dir
    gold.parent.mkdir()
    gold.write_text("hello")
    spec = {
        "func": "compare_text_file",
        "result": {"type": "vm_file", "path": DOCS + r"\a.txt", "dest": "a.txt"},
        "expected": {"type": "cache_file", "path": "gold.txt"},
    }
    assert evaluate(spec).score == 0.0
    assert evaluate({**spec, "options": {"ignore_case": True}}).score == 1.0
    bad = evaluate({**spec, "options": {"no_such_option_for_exact": 1}, "func": "exact_match"})
    assert bad.kind == "evaluation_error"


def test_metric_without_expected_gets_result_and_options(evaluate):
    seen = {}

    name = "_test_only_result_metric"
    if name not in METRICS:
        @metric(name)
        def _only_result(result, **options):
            seen["call"] = (result, options)
            return 0.5

    out = evaluate({"func": name, "result": {"type": "rule", "rules": "r"}, "options": {"k": 1}})
    assert (out.score, out.kind) == (0.5, "scored")  # fractional scores are kept
    assert seen["call"] == ("r", {"k": 1})


def test_vm_file_absent_is_a_legitimate_zero_with_reason(evaluate, vm, tmp_path):
    gold = tmp_path / "cache" / "gold.txt"
    gold.parent.mkdir()
    gold.write_text("x")
    spec = {
        "func": "compare_text_file",
        "result": {"type": "vm_file", "path": DOCS + r"\missing.txt", "dest": "m.txt"},
        "expected": {"type": "cache_file", "path": "gold.txt"},
    }
    out = evaluate(spec)
    assert (out.score, out.kind) == (0.0, "scored")
    assert "missing.txt does not exist on the VM" in out.reason


def test_single_metric_getter_exception_scores_zero_with_cause(evaluate, tmp_path):
    spec = exact({"type": "cache_file", "path": "nope.txt"}, 1)
    out = evaluate(spec)
    assert (out.score, out.kind) == (0.0, "scored")
    assert "cache_file" in out.reason and "AssertionError" in out.reason


def test_metric_exception_is_an_evaluation_error(evaluate):
    out = evaluate({"func": "is_in_list", "result": {"type": "rule", "rules": None}, "expected": rule("a")})
    assert out.kind == "evaluation_error"
    assert "is_in_list" in out.reason and "TypeError" in out.reason


def test_expected_getter_exception_is_an_evaluation_error(evaluate):
    out = evaluate({"func": "exact_match", "result": rule(1), "expected": {"type": "cache_file", "path": "x"}})
    assert out.kind == "evaluation_error"
    assert "expected getter cache_file" in out.reason


@pytest.mark.parametrize("bad", ["yes", None, 1.5, -0.1, float("nan")])
def test_non_numeric_or_out_of_range_score_is_an_evaluation_error(evaluate, bad):
    name = "_test_returns_" + repr(bad)
    if name not in METRICS:
        metric(name)(lambda result, expected, value=bad: value)
    out = evaluate({"func": name, "result": rule(1), "expected": rule(1)})
    assert out.kind == "evaluation_error"
    assert name in out.reason


def test_bool_score_counts_as_number(evaluate):
    if "_test_bool" not in METRICS:
        metric("_test_bool")(lambda result, expected: True)
    out = evaluate({"func": "_test_bool", "result": rule(1), "expected": rule(1)})
    assert (out.score, out.kind) == (1.0, "scored")


def test_unknown_metric_and_getter_are_named(evaluate):
    calls = []
    out = evaluate(
        {"func": "no_such_metric", "result": rule(1), "postconfig": [{"type": "sleep"}]},
        run_postconfig=calls.append,
    )
    assert out.kind == "evaluation_error" and "no_such_metric" in out.reason
    assert calls == []  # found before postconfig runs
    out = evaluate(exact({"type": "no_such_getter"}, 1))
    assert out.kind == "evaluation_error" and "no_such_getter" in out.reason
    out = evaluate({"func": ["exact_match"], "result": [rule(1)], "expected": [{"type": "bogus_getter"}]})
    assert out.kind == "evaluation_error" and "bogus_getter" in out.reason


def test_connection_error_is_infrastructure_never_a_zero(evaluate, vm):
    vm.down = True
    out = evaluate(exact({"type": "vm_file", "path": "C:\\a.txt", "dest": "a.txt"}, 1))
    assert out.kind == "infrastructure_error"
    assert "unreachable" in out.reason
    out = evaluate({"func": ["exact_match"], "result": [{"type": "vm_command_line", "command": "x"}],
                    "expected": [rule("")]})
    assert out.kind == "infrastructure_error"


def test_http_error_on_file_read_is_absent_like_waa(evaluate, vm):
    vm.http_errors["C:\\dir"] = 500
    spec = exact({"type": "vm_file", "path": "C:\\dir", "dest": "d"}, None)
    out = evaluate(spec, scoring="waa-compat")
    assert (out.score, out.kind) == (1.0, "scored")  # vm_file gave None, as WAA's controller does
    # The default never scores a getter call the server failed (adapters/outcomes.py R9).
    out = evaluate(spec)
    assert out.kind == "infrastructure_error" and "the server failed /file: HTTP 500: boom" in out.reason
    # A 4xx is the server's answer, not its failure: WAA's semantics under both.
    vm.http_errors["C:\\dir"] = 400
    assert (evaluate(spec).score, evaluate(spec).kind) == (1.0, "scored")


# -- postconfig, infeasible, FAIL ------------------------------------------------------------------


def test_postconfig_runs_first_even_for_infeasible(evaluate):
    steps = [{"type": "sleep", "parameters": {"seconds": 0}}]
    seen = []
    out = evaluate({"func": "infeasible", "postconfig": steps}, last_action="FAIL", run_postconfig=seen.append)
    assert seen == [steps]
    assert (out.score, out.kind) == (1.0, "scored")


def test_postconfig_without_runner_is_an_error_and_failures_are_classified(evaluate):
    spec = {**exact(rule(1), 1), "postconfig": [{"type": "sleep"}]}
    assert evaluate(spec).kind == "evaluation_error"
    assert evaluate(exact(rule(1), 1)).kind == "scored"  # no steps: no runner needed

    from adapters.waa.errors import WAAConnectionError

    def unreachable(steps):
        raise WAAConnectionError("/setup/execute", "down")

    def broken(steps):
        raise RuntimeError("window gone")

    assert evaluate(spec, run_postconfig=unreachable).kind == "infrastructure_error"
    out = evaluate(spec, run_postconfig=broken)
    assert out.kind == "evaluation_error" and "window gone" in out.reason


@pytest.mark.parametrize(
    ("last", "score"),
    [("FAIL", 1.0), ("DONE", 0.0), ("fail", 0.0), ("FAIL ", 0.0), (None, 0.0), ("WAIT", 0.0)],
)
def test_infeasible_scores_only_exact_fail(evaluate, last, score):
    for spec in ({"func": "infeasible"}, {"func": "infeasible", "result": {}, "expected": {}}):
        out = evaluate(spec, last_action=last)
        assert (out.score, out.kind) == (score, "scored")


def test_fail_on_feasible_task_scores_zero_without_reading_state(evaluate, vm):
    vm.down = True  # would be an infrastructure error if state were read
    out = evaluate(exact({"type": "vm_file", "path": "C:\\a", "dest": "a"}, None), last_action="FAIL")
    assert (out.score, out.kind) == (0.0, "scored")
    assert "FAIL" in out.reason


def test_infeasible_inside_a_func_list_is_an_error(evaluate):
    out = evaluate({"func": ["infeasible"], "result": [rule(1)], "expected": [None]}, last_action="FAIL")
    assert out.kind == "scored" and out.score == 0.0  # FAIL on a "feasible" (list) task: WAA's 0
    out = evaluate({"func": ["infeasible"], "result": [rule(1)], "expected": [None]}, last_action="DONE")
    assert out.kind == "evaluation_error"


# -- several metrics -------------------------------------------------------------------------------


def _multi(values, conj=None, expected=None):
    spec = {
        "func": ["exact_match"] * len(values),
        "result": [{"type": "rule", "rules": v} for v in values],
        "expected": expected or [rule(1)] * len(values),
    }
    if conj:
        spec["conj"] = conj
    return spec


def test_and_is_mean_and_stops_at_first_zero(evaluate, vm):
    assert evaluate(_multi([1, 1])).score == 1.0
    out = evaluate(_multi([0, 1]))
    assert out.score == 0.0 and len(out.details) == 1  # early exit: second metric never ran
    if "_test_half" not in METRICS:
        metric("_test_half")(lambda result, expected: 0.5)
    spec = {"func": ["_test_half", "exact_match"], "result": [val(1), val(1)], "expected": [rule(1), rule(1)]}
    assert evaluate(spec).score == pytest.approx(0.75)


def test_or_is_max_and_stops_at_first_one(evaluate):
    out = evaluate(_multi([1, 0], conj="or"))
    assert out.score == 1.0 and len(out.details) == 1
    assert evaluate(_multi([0, 0], conj="or")).score == 0.0
    if "_test_half" not in METRICS:
        metric("_test_half")(lambda result, expected: 0.5)
    spec = {"func": ["_test_half", "exact_match"], "result": [rule(1), rule(0)],
            "expected": [rule(1), rule(1)], "conj": "or"}
    assert evaluate(spec).score == 0.5


def test_multi_null_expected_and_options(evaluate, vm, tmp_path):
    vm.files[DOCS + r"\draft.txt"] = b"abc"
    gold = tmp_path / "cache" / "gold.txt"
    gold.parent.mkdir()
    gold.write_text("ABC")
    spec = {
        "func": ["exact_match", "compare_text_file"],
        "result": [
            {"type": "vm_file_exists_in_vm_folder", "folder_name": DOCS, "file_name": "draft.txt"},
            {"type": "vm_file", "path": DOCS + r"\draft.txt", "dest": "draft.txt"},
        ],
        "expected": [rule(1.0), {"type": "cache_file", "path": "gold.txt"}],
        "options": [None, {"ignore_case": True}],
    }
    out = evaluate(spec)
    assert (out.score, out.kind) == (1.0, "scored"), out.reason
    assert vm.calls[0] == ("get_file", DOCS + "/draft.txt")  # WAA joins with posixpath on its host


@pytest.mark.parametrize("key", ["result", "expected", "options"])
def test_length_mismatch_is_named(evaluate, key):
    spec = _multi([1, 1])
    spec["options"] = [{}, {}]
    spec[key] = spec[key][:1]
    out = evaluate(spec)
    assert out.kind == "evaluation_error"
    assert f"'{key}' has 1 entries" in out.reason


def test_multi_without_expected_and_bad_conj(evaluate):
    spec = _multi([1, 1])
    del spec["expected"]
    out = evaluate(spec)
    assert out.kind == "evaluation_error" and "expected" in out.reason
    out = evaluate(_multi([1, 1], conj="AND"))
    assert out.kind == "evaluation_error" and "AND" in out.reason


def test_multi_file_not_found_semantics(evaluate):
    from adapters.waa.evaluator import GETTERS, getter

    if "_test_fnf" not in GETTERS:
        @getter("_test_fnf")
        def _fnf(ctx, config):
            raise FileNotFoundError("gone.txt")

    fnf = {"type": "_test_fnf"}
    spec = {"func": ["exact_match", "exact_match"], "result": [val(1), fnf], "expected": [rule(1), rule(1)]}
    out = evaluate(spec)
    assert (out.score, out.kind) == (0.0, "scored") and "gone.txt" in out.reason
    # "or": WAA reuses the previous result state (a kept bug) ...
    out = evaluate({**spec, "conj": "or", "result": [val(0), fnf], "expected": [rule(1), rule(0)]})
    assert (out.score, out.kind) == (1.0, "scored") and "previous" in out.reason
    # ... and has none for the first metric (UnboundLocalError in WAA).
    out = evaluate({**spec, "conj": "or", "result": [fnf, val(1)]})
    assert out.kind == "evaluation_error"
    # any other getter exception in a multi-metric task is not caught by WAA
    out = evaluate({**spec, "result": [{"type": "cache_file", "path": "x"}, val(1)]})
    assert out.kind == "evaluation_error" and "cache_file" in out.reason


def test_malformed_specs_are_evaluation_errors(evaluate):
    for spec in [None, {}, {"func": 3}, {"func": "exact_match", "result": "vm_file"},
                 {"func": "exact_match", "result": rule(1), "expected": {}},
                 {"func": "exact_match", "result": rule(1), "expected": rule(1), "options": None},
                 {"func": ["exact_match"], "result": rule(1), "expected": [rule(1)]}]:
        out = evaluate(spec)
        assert isinstance(out, EvaluationOutcome)
        assert out.kind == "evaluation_error", spec
        assert out.reason


def test_known_deviations_are_written_down():
    assert len(KNOWN_DEVIATIONS) >= 5
    assert all(isinstance(item, str) and item for item in KNOWN_DEVIATIONS)


def test_outcome_rejects_scores_outside_unit_interval():
    with pytest.raises(ValueError):
        EvaluationOutcome(score=1.5, reason="x", kind="scored")


def test_real_client_and_fake_satisfy_the_protocol(vm):
    from adapters.waa.client import WAAClient
    from adapters.waa.evaluator import VMConnection

    assert isinstance(vm, VMConnection)
    for name in ("get_file", "list_directory", "execute", "desktop_path", "documents_path",
                 "file_exists", "folder_exists", "accessibility"):
        assert callable(getattr(WAAClient, name)), name
