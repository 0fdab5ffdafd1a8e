"""A revision and a repository's GGUF file name become paths in the HF cache (`refs/REVISION`,
`snapshots/COMMIT/FILE`): each is checked as the hub names them before huggingface_hub joins
it to a folder, in the endpoint file and in `epycctl check-model`, and a refusal of
huggingface_hub's own is one line naming the key, never quoting a file it read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from epycd.cli import main
from epycd.errors import InputError
from epycd.model.hub import locate_gguf, locate_model
from epycd.names import repo_file_problem, revision_problem
from epycd.spec import parse_endpoint
from tests.model.hf_cache import add_to_cache, repo_folder

SECRET = "/SECRET-LINE-OF-A-FILE"
"""A file's content that huggingface_hub would read as a commit and quote in its error."""
HEX40 = "0123456789abcdef" * 2 + "01234567"
BAD_REVISIONS = ["../../x", "/etc/passwd", "a/../b", "..", "a//b", "main/", ".hidden", "x.lock"]
BAD_FILES = ["../x.gguf", "a/../../x.gguf", "/etc/x.gguf", "a\\..\\b.gguf", "C:x.gguf", "a//b.gguf"]


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", HEX40, "release-2.1_rc"])
def test_branches_tags_and_commits_are_revisions(revision: str) -> None:
    assert revision_problem(revision) is None


@pytest.mark.parametrize("revision", BAD_REVISIONS)
def test_paths_are_no_revisions(revision: str) -> None:
    assert revision_problem(revision) is not None


@pytest.mark.parametrize("name", ["model-Q4_K_M.gguf", "sub/model.gguf"])
def test_relative_names_are_repository_files(name: str) -> None:
    assert repo_file_problem(name) is None


@pytest.mark.parametrize("name", BAD_FILES)
def test_paths_that_leave_the_repository_are_refused(name: str) -> None:
    assert repo_file_problem(name) is not None


@pytest.mark.parametrize("revision", ["../../x", "/etc/passwd", "a/../b", "a//b", ".hidden"])
def test_an_endpoint_files_revision_path_is_refused_naming_file_key_and_fix(
    tmp_path: Path, revision: str
) -> None:
    path = tmp_path / "chat.toml"
    text = f'model = "Org/Name"\nrevision = "{revision}"\n'
    result = parse_endpoint(path, text.encode(), precisions=["bfloat16"])
    assert result.spec is None
    (error,) = result.errors
    assert (error.file, error.key) == (str(path), "revision")
    assert error.fix and "40 hex digits" in error.fix and "no '..'" in error.fix, str(error)


@pytest.mark.parametrize("revision", ["main", "refs/pr/1", HEX40])
def test_an_endpoint_files_revision_is_kept(tmp_path: Path, revision: str) -> None:
    text = f'model = "Org/Name"\nrevision = "{revision}"\n'
    result = parse_endpoint(tmp_path / "chat.toml", text.encode(), precisions=["bfloat16"])
    assert result.spec is not None and result.spec.revision == revision


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An offline HF_HOME whose cache holds Org/Name, and a file beside it that a revision
    climbing out of `refs/` would reach."""
    home = tmp_path / "hf"
    add_to_cache(home / "hub", "Org/Name", {"config.json": b"{}", "x.gguf": b"GGUF"})
    (home / "secret").write_text(SECRET + "\n")
    for name in ("HF_HUB_CACHE", "HF_TOKEN", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


CLIMB = "../../../secret"
"""From HF_HOME/hub/models--Org--Name/refs/ to HF_HOME/secret."""


def test_a_climbing_revision_is_bad_input_before_the_hub_reads_a_file(cache: Path) -> None:
    for look in (
        lambda: locate_gguf("Org/Name", "x.gguf", revision=CLIMB),
        lambda: locate_model("Org/Name", revision=CLIMB),
        lambda: locate_gguf("Org/Name", "x.gguf", revision=str(cache / "secret")),
    ):
        with pytest.raises(InputError) as caught:
            look()
        assert caught.value.key == "revision" and SECRET not in str(caught.value)


@pytest.mark.parametrize("name", BAD_FILES)
def test_a_gguf_file_outside_the_repository_is_bad_input(cache: Path, name: str) -> None:
    for model in ("Org/Name", str(cache)):
        with pytest.raises(InputError) as caught:
            locate_gguf(model, name)
        assert caught.value.key == "gguf_file", str(caught.value)


def test_the_hubs_own_refusal_is_one_line_without_the_files_content(cache: Path) -> None:
    """A ref in the cache that holds no commit (here a path): huggingface_hub's ValueError
    quotes it; ours names the key and the fix only."""
    (repo_folder(cache / "hub", "Org/Name") / "refs" / "main").write_text(SECRET)
    with pytest.raises(InputError) as caught:
        locate_gguf("Org/Name", "x.gguf", revision="main")
    text = str(caught.value)
    assert caught.value.key == "revision" and SECRET not in text and "\n" not in text, text


@pytest.mark.parametrize(
    "args",
    [
        ["Org/Name", "--gguf-file", "../../x.gguf"],
        ["Org/Name", "--gguf-file", "/etc/x.gguf"],
        ["Org/Name", "--gguf-file", "x.gguf", "--revision", CLIMB],
        ["Org/Name", "--revision", "/etc/passwd"],
    ],
)
def test_check_model_refuses_a_path_with_one_line_and_exit_2(cache: Path, args: list[str]) -> None:
    result = CliRunner().invoke(main, ["check-model", *args])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert ("gguf_file" in lines[0] or "revision" in lines[0]) and SECRET not in result.output
    as_json = CliRunner().invoke(main, ["check-model", *args, "--json"])
    data = json.loads(as_json.stdout)
    assert as_json.exit_code == 2 and data["result"] == "error" and data["exit_code"] == 2
