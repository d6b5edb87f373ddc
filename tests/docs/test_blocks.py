"""The docs' block reader (tests/docs/blocks.py): pure, on pasted Markdown."""

from __future__ import annotations

import pytest

from docs import blocks

PAGE = """# a page

```console
$ governor check x.toml
governor: policy file not found (x.toml)
hint: give the path
[exit 66]
$ echo one \\
> two
one two
```

<!-- docs: skip needs a board; tests/systemd/test_x.py covers it -->
```sh
systemctl start governor@chat   # a comment
```

```sh
# a comment line is no command
E=/var/lib/governor/engine
governor init --model $E/m.gguf \\
    -o chat.toml
```

```toml
name = "chat"
```
"""


def test_console_commands_their_output_and_exit_code() -> None:
    console, skipped, sh, toml = blocks.parse(PAGE, "p.md")
    assert console.lang == "console" and console.skip is None and console.line == 3
    check, echo = console.commands
    assert check == blocks.Command(
        4,
        "governor check x.toml",
        ("governor: policy file not found (x.toml)", "hint: give the path"),
        66,
    )
    assert echo.text == "echo one \\\ntwo" and echo.output == ("one two",) and echo.exit_code == 0
    assert skipped.skip == "needs a board; tests/systemd/test_x.py covers it"
    assert [c.text for c in sh.commands] == [
        "E=/var/lib/governor/engine",
        "governor init --model $E/m.gguf \\\n    -o chat.toml",
    ]
    assert all(c.output is None for c in sh.commands)
    assert toml.commands == ()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("```\nls\n```\n", "block language '(none)'"),
        ("```bash\nls\n```\n", "block language 'bash'"),
        ("```console\nfoo\n```\n", "console output before any `$ ` command"),
        ("```sh\nls\n", "never closed"),
        ("<!-- docs: run -->\n```sh\nls\n```\n", "a mark is"),
        ("<!-- docs: skip -->\n```sh\nls\n```\n", "a mark is"),
    ],
)
def test_unreadable_blocks_are_errors_with_the_line(text: str, why: str) -> None:
    with pytest.raises(blocks.BlockError, match=r"p\.md:") as err:
        blocks.parse(text, "p.md")
    assert why in str(err.value)


@pytest.mark.parametrize("lang", ["text", "toml"])
def test_a_shown_command_in_a_block_that_never_runs_is_refused_with_its_line(lang: str) -> None:
    """A `$ governor ...` in a `text` block is never run, so its output drifts unseen (issue
    43: four such blocks, README's `governor board` table among them)."""
    page = (
        f"# a page\n\n```{lang}\nthe board now:\n$ governor board\nboard: MemTotal 1967 MiB\n```\n"
    )
    with pytest.raises(blocks.BlockError, match=r"^p\.md:5: ") as err:
        blocks.parse(page, "p.md")
    assert f"a `{lang}` block (line 3)" in str(err.value) and "console" in str(err.value)


def test_a_shown_command_in_a_block_marked_skip_is_read_and_not_run() -> None:
    page = (
        "<!-- docs: skip needs a board; tests/kernel/test_x.py covers it -->\n"
        "```text\n$ governor board\nboard: MemTotal 1967 MiB\n```\n"
        "```text\nno command: $ governor inside a line is prose\n```\n"
    )
    skipped, prose = blocks.parse(page, "p.md")
    assert skipped.tier == blocks.SKIP and skipped.commands == () and prose.tier == blocks.HOST


@pytest.mark.parametrize(
    ("shown", "got", "ok"),
    [
        (("a", "b"), ["a", "b"], True),
        (("a", "b"), ["a", "c"], False),
        (("a",), ["a", "b"], False),  # more output than shown is a difference
        (("chat  pid ... up ...",), ["chat  pid 412 up 0m03s"], True),
        (("chat  pid ... up ...",), ["mail  pid 412 up 0m03s"], False),
        (("head", "...", "tail"), ["head", "x", "y", "tail"], True),
        (("head", "...", "tail"), ["head", "tail"], True),
        (("head", "...", "tail"), ["head", "x"], False),
        (("...",), [], True),
        (("a.b (x)",), ["aXb (x)"], False),  # text is literal, not a regex
        (("a  ",), ["a"], True),  # trailing blanks do not count
    ],
)
def test_shown_output_matches(shown: tuple[str, ...], got: list[str], ok: bool) -> None:
    assert blocks.matches(shown, got) is ok
