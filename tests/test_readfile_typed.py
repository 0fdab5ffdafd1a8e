"""The typed readers of epycd/readfile.py: content that is not what it should be is an
InputError naming the file, the key and the fix; what is not a regular file stays refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import BaseModel

from epycd.errors import InputError
from epycd.readfile import RefusedFile, read_json_object, read_model


class Pair(BaseModel):
    name: str
    size: int


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ('{"name": "a", "size": "big"}', "size: Input should be a valid integer"),
        ('{"name": "a"}', "size: Field required"),
        ("{name", "Invalid JSON"),
        ("\xff", "Invalid JSON"),
        ("[]", "Input should be an object"),
    ],
)
def test_read_model_names_the_file_the_key_and_the_fix(
    tmp_path: Path, content: str, said: str
) -> None:
    path = tmp_path / "pair.json"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(InputError) as caught:
        read_model(path, 1024, Pair, fix="write it again")
    assert str(caught.value).startswith(f"{path}: ")
    assert said in str(caught.value)
    assert str(caught.value).endswith("(write it again)")


def test_read_model_reads_a_good_file(tmp_path: Path) -> None:
    path = tmp_path / "pair.json"
    path.write_text('{"name": "a", "size": 3}')
    assert read_model(path, 1024, Pair, fix="-") == Pair(name="a", size=3)


@pytest.mark.parametrize(
    ("content", "said"), [("[1]", "a JSON list, not an object"), ("{", "is not JSON")]
)
def test_read_json_object_refuses_what_is_not_an_object(
    tmp_path: Path, content: str, said: str
) -> None:
    path = tmp_path / "x.json"
    path.write_text(content)
    with pytest.raises(InputError, match=said):
        read_json_object(path, 1024, fix="-")


def test_the_typed_readers_keep_the_byte_rules(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(RefusedFile, match="FIFO"):
        read_model(fifo, 1024, Pair, fix="-")
    big = tmp_path / "big.json"
    big.write_text('{"name": "' + "a" * 2000 + '", "size": 1}')
    with pytest.raises(RefusedFile, match="larger than"):
        read_json_object(big, 1024, fix="-")
