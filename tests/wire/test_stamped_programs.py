"""An answer's request id is added to a plan kept for many answers: its wire program is
the kept plan's, compiled once, with the id's header lines put in its head. Against the
program compiled from the stamped plan itself, for any plan and kind of request: the
same status line, the same header lines (as a set: the id's come last), the same body
bytes and segments."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from chaosllm.model import Ending, ResponsePlan
from chaosllm.providers import PROVIDERS
from chaosllm.wire.program import Program, compile_program, program_for
from tests.helpers import wire_plans

PLANS = wire_plans(delay_ms=5.0, stall_ms=10.0, endings=list(Ending))


def _parts(program: Program) -> tuple[object, ...]:
    head_and_rest = program.first()
    head, _, rest = head_and_rest.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    dated = frozenset(line for line in lines if not line.lower().startswith(b"date:"))
    later = [(s[0], s[1], s[2], s[3], s[4]) for s in program.segments[1:]]
    first = program.segments[0]
    return (status, dated, rest, first[0], first[2:], later, program.ending, program.keep)


@settings(max_examples=300, deadline=None)
@given(
    plan=PLANS,
    provider=st.sampled_from(["openai.chat", "azure.chat", "bedrock.converse"]),
    variant=st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()),
)
def test_a_stamped_plans_program_is_its_own_compiled(
    plan: ResponsePlan, provider: str, variant: tuple[bool, bool, bool, bool]
) -> None:
    is_head, http10, keep_alive, close = variant
    options = {"is_head": is_head, "http10": http10, "keep_alive": keep_alive, "close": close}
    stamped = PROVIDERS[provider].errors.stamped(plan, "7:1")
    try:
        expected = compile_program(stamped, **options)
    except RuntimeError:
        return  # a head h11 refuses: refused either way
    got = program_for(stamped, **options)
    assert _parts(got) == _parts(expected)
    if stamped is not plan and plan.send_head:
        assert stamped.stamped_from[0] is plan  # the derived program, not a compile
        assert got is not program_for(stamped, **options)  # nor kept: each id its own


@settings(max_examples=200, deadline=None)
@given(plan=PLANS, extra=st.lists(st.tuples(st.text(max_size=5), st.text(max_size=5))))
def test_with_headers_is_with_(plan: ResponsePlan, extra: list[tuple[str, str]]) -> None:
    headers = plan.headers + tuple(extra)
    assert plan.with_headers(headers) == plan.with_(headers=headers)


@settings(max_examples=100, deadline=None)
@given(plan=PLANS, provider=st.sampled_from(sorted(PROVIDERS)))
def test_stamping_a_plan_again_stamps_it_as_the_first_time(
    plan: ResponsePlan, provider: str
) -> None:
    """What a plan lacks is worked out once and kept on it: a kept plan stamped for its
    second answer gets what a fresh copy of it gets."""
    errors = PROVIDERS[provider].errors
    errors.stamped(plan, "7:1")
    again = errors.stamped(plan, "7:2")
    fresh = errors.stamped(plan.with_(), "7:2")
    assert again == fresh
    assert again.headers[: len(plan.headers)] == plan.headers
