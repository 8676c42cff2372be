"""MkDocs hook: the reference pages generated from the code (`chaosllm.reference`), and
the changelog from CHANGELOG.md, added to the site as it is built (nothing is written to
docs/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent


def generated_pages() -> dict[str, str]:
    """docs path -> markdown, for every page made from the code."""
    from chaosllm.cli import _parser
    from chaosllm.reference import cli_page, control_plane_page, fault_catalogue_page

    return {
        "reference/faults.md": fault_catalogue_page(),
        "reference/cli.md": cli_page(_parser()),
        "reference/control-plane.md": control_plane_page(),
        "changelog.md": (ROOT / "CHANGELOG.md").read_text("utf-8"),
    }


def on_files(files: Files, config: Any) -> Files:
    for path, content in generated_pages().items():
        files.append(File.generated(config, path, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """``<!-- generated: PATH -->`` becomes the file at PATH (a shipped recording) as a
    JSON block, so the recording format's example is a real recording."""
    out: list[str] = []
    for line in markdown.splitlines():
        marker = line.strip()
        if marker.startswith("<!-- generated: ") and marker.endswith(" -->"):
            source = ROOT / marker[len("<!-- generated: ") : -len(" -->")]
            out += ["```json", source.read_text("utf-8").rstrip(), "```"]
        else:
            out.append(line)
    return "\n".join(out) + "\n"
