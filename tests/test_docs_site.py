"""The README and the guides as specifications: the site builds with every link resolved, the README's snippets run
as pasted, its test command is CI's, its measured table is what benchmarks/results/ holds, and benchmark outputs
live under benchmarks/results/, not docs/."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_scripts import benchmark_module
from server_helpers import serve_tiny_model

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
RESULT_PATH = re.compile(r"benchmarks/results/[\w./-]+\w")


def fenced_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def test_the_guides_build_strictly(tmp_path):
    # --strict turns every broken link, missing image or unknown anchor target into a failure
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "serving" / "index.html").exists()


def test_the_readme_test_command_is_what_ci_runs():
    ci_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_command in [block.strip() for block in fenced_blocks(README, "bash")]


def test_every_relative_link_in_the_readme_resolves():
    targets = [link.split("#")[0] for link in re.findall(r"\]\(([^)\s]+)\)", README) if "://" not in link]
    assert targets
    assert [target for target in targets if not (ROOT / target).exists()] == []


def test_every_result_file_the_docs_name_exists():
    texts = [README, (ROOT / "benchmarks" / "README.md").read_text(), *(page.read_text() for page in DOCS.rglob("*.md"))]
    named = {path.rstrip(".") for text in texts for path in RESULT_PATH.findall(text)}
    assert named
    assert sorted(path for path in named if "RUN" not in path and not (ROOT / path).exists()) == []


def test_no_benchmark_output_under_docs():
    outputs = [path.relative_to(ROOT).as_posix() for path in DOCS.rglob("*") if path.suffix in (".json", ".txt", ".csv")]
    assert outputs == [], "benchmark outputs belong under benchmarks/results/<benchmark>/"
    # an image under docs/ is a figure some guide shows; one no page shows is a stray output
    pages = "".join(page.read_text() for page in DOCS.rglob("*.md"))
    assert [image.name for image in DOCS.rglob("*.png") if image.name not in pages] == []


def test_every_benchmark_script_is_listed_in_the_benchmarks_readme():
    listing = (ROOT / "benchmarks" / "README.md").read_text()
    scripts = sorted(path.name for path in (ROOT / "benchmarks").glob("*.py"))
    assert [name for name in scripts if name not in listing] == []


def test_the_measured_table_is_the_results_table():
    with benchmark_module("readme_table") as readme_table:
        assert readme_table.with_table(README) == README, "run: python benchmarks/readme_table.py"
        table = readme_table.table()
    # one row per comparison, each with its peer's figure, a date and a commit
    rows = table.splitlines()[2:]
    assert len(rows) >= 4
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 7 and all(cells), row
        assert re.search(r"\d", cells[2]) and re.fullmatch(r"`[0-9a-f]{7,40}`", cells[5]), row


def test_the_readme_snippets_work_as_pasted():
    curl = next(block for block in fenced_blocks(README, "bash") if block.startswith("curl"))
    client = next(block for block in fenced_blocks(README, "python") if "from openai import OpenAI" in block)
    assert "http://127.0.0.1:8000" in curl and "http://127.0.0.1:8000/v1" in client
    with serve_tiny_model() as server:
        # the snippets name the default port; the tiny server listens where it could
        answer = subprocess.run(["bash", "-c", curl.replace("http://127.0.0.1:8000", server.url)],
                                capture_output=True, text=True, timeout=60)
        assert answer.returncode == 0, answer.stderr
        assert '"role":"assistant"' in answer.stdout.replace(" ", "")
        printed = subprocess.run([sys.executable, "-c", client.replace("http://127.0.0.1:8000", server.url)],
                                 capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.strip(), "the snippet printed no answer"


def test_the_readme_structured_output_snippets_work_as_pasted():
    """The curl json_schema request, the openai client's parse and the pydantic-ai agent, against the tiny model: its
    words are random, yet every answer must parse, as the grammar writes it."""
    curl = next(block for block in fenced_blocks(README, "bash") if '"response_format"' in block)
    client = next(block for block in fenced_blocks(README, "python") if "from pydantic_ai import Agent" in block)
    with serve_tiny_model(num_blocks=512, context=2048) as server:  # pydantic-ai's output tool: ~560 prompt tokens
        answer = subprocess.run(["bash", "-c", curl.replace("http://127.0.0.1:8000", server.url)],
                                capture_output=True, text=True, timeout=60)
        assert answer.returncode == 0, answer.stderr
        content = json.loads(json.loads(answer.stdout)["choices"][0]["message"]["content"])
        assert isinstance(content["name"], str)
        printed = subprocess.run([sys.executable, "-c", client.replace("http://127.0.0.1:8000", server.url)],
                                 capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.count("name=") == 2, printed.stdout  # the parsed reply and the agent's typed output


@pytest.mark.parametrize("section", ["## Two commands on a fresh machine", "## Serve and call it", "## Measured on this machine",
                                     "## Known gaps"])
def test_the_readme_keeps_its_front_door(section):
    assert section in README
    assert len(README.splitlines()) <= 200
