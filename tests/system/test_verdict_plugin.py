"""Verdicts in a pytest run of the user's own (issue #17): ``verdict="strict"`` fails a
passing test whose client has findings, printing them and the journal; ``"warn"`` lists
them in the terminal summary and passes; off by default; ``--chaosllm-verdict`` sets the
default and the marker wins."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(120)

CLIENT = """
import openai
import pytest

QUESTION = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}]


def ask_once(chaosllm):
    '''A client that gives up at once: a 503 is the caller's problem.'''
    chaosllm.arm("http_503")
    with chaosllm.openai(max_retries=0, timeout=5) as client:
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="gpt-4o-mini", messages=QUESTION)
"""


def test_strict_fails_warn_reports_off_by_default(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_verdicts=CLIENT
        + """

@pytest.mark.chaosllm(verdict="strict")
def test_strict(chaosllm):
    ask_once(chaosllm)


@pytest.mark.chaosllm(verdict="warn")
def test_warn(chaosllm):
    ask_once(chaosllm)


def test_off(chaosllm):
    ask_once(chaosllm)


@pytest.mark.chaosllm(shared=True, verdict="strict")
def test_strict_shared(chaosllm):
    ask_once(chaosllm)
    chaosllm.reset()  # a second session of the same test: still judged


@pytest.mark.chaosllm(verdict="strict", tolerances={"min_attempts": 1})
def test_strict_tolerant(chaosllm):
    ask_once(chaosllm)


def test_the_fixture_says_what_it_found(chaosllm):
    ask_once(chaosllm)
    (found,) = chaosllm.verdict()
    assert found.name == "gave_up_early" and found.seqs == (1,)
    assert chaosllm.verdict(min_attempts=1) == []
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, failed=2)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "FAILED test_verdicts.py::test_strict - Failed: chaosllm verdict (strict): 1 f*",
            "FAILED test_verdicts.py::test_strict_shared - Failed: chaosllm verdict (stric*",
        ]
    )
    # strict: the finding and the journal, in the failure report
    result.stdout.fnmatch_lines(
        [
            "*chaosllm verdict (strict): 1 finding about the client's behaviour",
            "*gave_up_early #1: #1 failed (http_503 (503)), which a retry can cure, and the "
            "client never sent it again (1 attempt)",
            "journal:",
            "*#1 session=None status=503 *fault=http_503*",
        ]
    )
    # warn: listed in the summary, the test passes
    result.stdout.fnmatch_lines(
        [
            "*= chaosllm verdict (warn) =*",
            "test_verdicts.py::test_warn: 1 finding",
            "*gave_up_early #1: *",
        ]
    )
    summary = out[out.index("chaosllm verdict (warn)") : out.index("short test summary")]
    assert "test_off" not in summary and "test_strict" not in summary


def test_the_option_sets_the_default_and_the_marker_wins(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_verdicts=CLIENT
        + """

def test_plain(chaosllm):
    ask_once(chaosllm)


@pytest.mark.chaosllm(verdict="off")
def test_marked_off(chaosllm):
    ask_once(chaosllm)


def test_recovered(chaosllm):
    chaosllm.arm("http_503")
    with chaosllm.openai(max_retries=2, timeout=5) as client:
        client.chat.completions.create(model="gpt-4o-mini", messages=QUESTION)


@pytest.mark.chaosllm(verdict="loud")
def test_bad_mode(chaosllm):
    pass


@pytest.mark.chaosllm(tolerances={"floor": 1})
def test_bad_tolerance(chaosllm):
    pass
"""
    )
    options = ("--chaosllm-shared", "-p", "no:randomly", "-p", "no:cacheprovider")
    result = pytester.runpytest_subprocess("--chaosllm-verdict", "strict", *options)
    result.assert_outcomes(passed=2, failed=1, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*verdict='loud'*give one of off, warn, strict*",
            "*no tolerance 'floor'; valid: *",
            "FAILED test_verdicts.py::test_plain - Failed: chaosllm verdict (strict)*",
        ]
    )
    # Off by default: the same file passes (the bad marker values still refused).
    plain = pytester.runpytest_subprocess(*options)
    plain.assert_outcomes(passed=3, errors=2)
    assert "chaosllm verdict" not in plain.stdout.str()


def test_the_option_is_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")  # in process: the plugin is loaded here too
    result.stdout.fnmatch_lines(["*--chaosllm-verdict={off,warn,strict}*"])
    markers = pytester.runpytest("--markers")
    markers.stdout.fnmatch_lines(["*verdict=None, tolerances=None*"])
