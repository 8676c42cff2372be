"""The engine's named extension points: where a behaviour that only some requests or
some compatibility modes need plugs in, so that the engine's stages name none of them.

Each point is an ordered tuple of plain functions, called at a fixed place:

=================  =========================================================================
``before_match``   after a request is prepared, before the matcher: an exchange that answers
                   it without a recording (DocsGPT's in-band directives), else None
``on_miss``        when no recording matches, before the miss is answered: a decision of its
                   own (a fixture saved since the load, then the request handled again), or
                   None to go on
``fallback``       the canned answer of ``--on-miss fallback``, when a mode has its own
``review``         once a recording is chosen: checks of the request against it and the
                   answer adapted to the live run (`chaosllm.core.review.Reviewer`); in order,
                   the core's own among them
``exchange``       the chosen exchange as this request gets it (DocsGPT's stub echoes the
                   request's model)
``headers``        headers a mode adds to every answer it serves (DocsGPT's CORS)
``plan``           the plan as sent, last (DocsGPT's delay headers)
``answered``       the answer as shaped, before it is journalled, with the whole plan a
                   fault cut (`chaosllm.core.call.Answer`): what a feature keeps of it and
                   answers instead (a background response stored, the client told it is
                   queued)
=================  =========================================================================

A hook that makes an answer depend on anything but the request and the server's state
version says so (``request.keep = False``), so that the memo does not keep it. The
plug-ins are in `chaosllm.core.compat`, one module each; `default_hooks` composes them
with the core's own reviewers, as vcrpy composes its ``before_record`` functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chaosllm.core.call import Answer, Chosen, Decision, Headers, Request
from chaosllm.core.review import Reviewer
from chaosllm.model import Exchange, ResponsePlan

if TYPE_CHECKING:
    from chaosllm.core.engine import Engine

__all__ = ["Hooks", "default_hooks"]


@dataclass(frozen=True, slots=True)
class Hooks:
    """The functions registered at each extension point (see the module doc)."""

    before_match: tuple[Callable[[Engine, Request], Chosen | None], ...] = ()
    on_miss: tuple[Callable[[Engine, Request], Decision | None], ...] = ()
    fallback: tuple[Callable[[Engine, Request], Exchange | None], ...] = ()
    review: tuple[Reviewer, ...] = ()
    exchange: tuple[Callable[[Engine, Request, Exchange], Exchange], ...] = ()
    headers: tuple[Callable[[Engine, Request], Headers], ...] = ()
    plan: tuple[Callable[[Engine, Request, ResponsePlan], ResponsePlan], ...] = ()
    answered: tuple[Callable[[Engine, Request, Answer], None], ...] = ()

    def __add__(self, other: Hooks) -> Hooks:
        """Both tables, `self`'s functions first at every point."""
        return Hooks(
            *(
                getattr(self, name) + getattr(other, name)
                for name in Hooks.__dataclass_fields__  # in field order
            )
        )


def default_hooks() -> Hooks:
    """The core's reviewers and every compatibility plug-in, in the order they run: the
    request's checks, the answer adapted (a trace step's bindings, then the workspace),
    the answer to serve checked (structured outputs), ``--strict`` last."""
    from chaosllm.core import background, mcp, review
    from chaosllm.core.compat import docsgpt, gateway, ironclaw, structured

    return (
        Hooks(review=(review.system_prompt,))
        + ironclaw.HOOKS
        + Hooks(review=(review.adapt_answer,))
        + structured.HOOKS
        + Hooks(review=(review.strict,))
        + docsgpt.HOOKS
        + mcp.HOOKS
        + gateway.HOOKS
        + background.HOOKS
    )
