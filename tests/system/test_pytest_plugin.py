"""The pytest plugin, exercised the way users meet it: in a pytest run of their own."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

README_EXAMPLE = """
from hypothesis import given
from chaosllm.strategies import fault_schedules, resilience_settings

QUESTION = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}]

@resilience_settings
@given(schedule=fault_schedules(max_faults=2, types=["http_503", "http_429", "http_error"]))
def test_my_client_recovers(chaosllm, schedule):
    chaosllm.reset()
    chaosllm.arm(schedule)
    with chaosllm.openai(max_retries=2, timeout=5) as client:
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=QUESTION)
    assert reply.choices[0].message.content == "The capital of France is Paris."
"""


def test_fixture_is_registered_by_the_entry_point(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import httpx

        def test_server(chaosllm):
            assert httpx.get(chaosllm.url + "/health").json()["status"] == "ok"
            assert chaosllm.base_url.endswith("/v1")
            assert chaosllm.env["OPENAI_BASE_URL"] == chaosllm.base_url
            assert chaosllm.session is None
    """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_markers_and_options_are_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.chaosllm(shared=False, recordings=None, *"])
    result = pytester.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(
        ["*--chaosllm-recordings=DIR*", "*--chaosllm-seed=N*", "*--chaosllm-shared*"]
    )


def test_fresh_server_per_test_is_reset(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        def test_one(chaosllm):
            chaosllm.arm("http_503", remaining=5)
            assert len(chaosllm.faults()["armed"]) == 1

        def test_two(chaosllm):
            assert chaosllm.faults() == {"armed": [], "fired": []}
    """
    )
    pytester.runpytest_subprocess("-p", "no:randomly").assert_outcomes(passed=2)


def test_shared_server_isolates_tests_by_session(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest

        BODY = dict(model="gpt-4o-mini", messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}])
        servers = []

        @pytest.mark.chaosllm(shared=True)
        def test_one(chaosllm):
            servers.append(chaosllm.server)
            chaosllm.arm("http_503", remaining=50)
            with chaosllm.openai(max_retries=0) as client:
                with pytest.raises(Exception):
                    client.chat.completions.create(**BODY)
            assert [e["status"] for e in chaosllm.requests()] == [503]

        @pytest.mark.chaosllm(shared=True)
        def test_two(chaosllm):
            servers.append(chaosllm.server)
            assert servers[0] is servers[1]
            assert chaosllm.faults()["armed"] == []   # test_one's fault was disarmed
            with chaosllm.openai(max_retries=0) as client:
                client.chat.completions.create(**BODY)
            assert [e["status"] for e in chaosllm.requests()] == [200]
    """
    )
    pytester.runpytest_subprocess("-p", "no:randomly").assert_outcomes(passed=2)


def test_marker_options_configure_the_server(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest

        @pytest.mark.chaosllm(on_miss="fallback", profile="rate-limit-burst", seed=7)
        def test_it(chaosllm):
            assert chaosllm.server.config.seed == 7
            assert [f["type"] for f in chaosllm.faults()["armed"]] == ["http_429"]
            chaosllm.reset()
            with chaosllm.openai() as client:
                reply = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "never recorded"}])
            assert reply.choices[0].message.content.startswith("[chaosllm fallback]")

        @pytest.mark.chaosllm(colour="red")
        def test_bad_marker(chaosllm):
            pass
    """
    )
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*has no option 'colour'*"])


def test_seed_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        def test_it(chaosllm):
            assert chaosllm.server.config.seed == 42
    """
    )
    pytester.runpytest_subprocess("--chaosllm-seed", "42").assert_outcomes(passed=1)


def test_the_readme_property_test_runs(pytester: pytest.Pytester) -> None:
    assert len([line for line in README_EXAMPLE.strip().splitlines() if line.strip()]) < 15
    pytester.makepyfile(test_readme=README_EXAMPLE)
    pytester.runpytest_subprocess().assert_outcomes(passed=1)


def test_a_failing_property_prints_the_shrunk_schedule_and_journal(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_it="""
        from hypothesis import HealthCheck, given, note, settings
        from chaosllm.resilience import assert_attempts, format_journal
        from chaosllm.strategies import fault_schedules

        @settings(max_examples=30, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(schedule=fault_schedules(max_faults=3, types=["http_503", "http_429"]))
        def test_naive_client_without_retries(chaosllm, schedule):
            chaosllm.reset()
            chaosllm.arm(schedule)
            with chaosllm.openai(max_retries=0) as client:
                try:
                    client.chat.completions.create(model="gpt-4o-mini", messages=[
                        {"role": "system", "content": "You are a helpful assistant."},
                        {"role": "user", "content": "What is the capital of France?"}])
                except Exception:
                    pass
            note(format_journal(chaosllm.requests()))
            assert_attempts(chaosllm.requests(), len(schedule) + 1)
    """
    )
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(failed=1)
    # hypothesis words it "Falsifying example" or (since 6.16x) "Failing test case"
    result.stdout.re_match_lines(
        [
            r".*(Falsifying example|Failing test case).*",
            r".*schedule=.*http_503.*",
            r".*#1 session=None status=503.*",
        ]
    )
