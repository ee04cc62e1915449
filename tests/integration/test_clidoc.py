"""Shell completion and man pages made from the commands' own parsers (issue #26, item 7):
generation works, covers every subcommand and option of noded and nodectl, bash and zsh
take the scripts, bash completes with them, and man renders the pages without a warning."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess

import pytest

from noded.admin.nodectl import build_parser as nodectl_parser
from noded.commands.cli import build_parser as noded_parser
from noded.commands.clidoc import write_all


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli")
    written = write_all(str(out))
    assert sorted(os.path.relpath(p, out) for p in written) == sorted([
        "bash-completion/completions/noded", "bash-completion/completions/nodectl", "zsh/site-functions/_noded",
        "zsh/site-functions/_nodectl", "man/man1/noded.1", "man/man1/nodectl.1"])
    return out


@pytest.mark.parametrize("prog, parser", [("noded", noded_parser), ("nodectl", nodectl_parser)])
def test_every_subcommand_and_option_is_in_the_completions_and_the_man_page(made, prog, parser):
    bash = (made / "bash-completion/completions" / prog).read_text()
    zsh = (made / "zsh/site-functions" / f"_{prog}").read_text()
    man = (made / "man/man1" / f"{prog}.1").read_text()
    for name, sub in subcommands(parser()).items():
        assert f"        {name}) COMPREPLY=" in bash and f"'{name}:" in zsh and f".SS {name}" in man, name
        for action in sub._actions:
            for flag in action.option_strings:
                assert flag in bash and flag in zsh and flag.replace("-", "\\-") in man, (name, flag)


def bash_complete(script, *words: str) -> list[str]:
    prog = os.path.basename(script)
    line = " ".join(words)
    p = subprocess.run(["bash", "-c", f'source "$0"; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _{prog}; '
                        'printf "%s\\n" "${COMPREPLY[@]}"', str(script)], capture_output=True, text=True, timeout=30,
                       check=True)
    return p.stdout.split()


def test_bash_completes_commands_options_and_choices(made):
    d = made / "bash-completion/completions"
    for script in d.iterdir():
        subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    assert bash_complete(d / "nodectl", "nodectl", "thr") == ["throttle"]
    assert bash_complete(d / "nodectl", "nodectl", "throttle", "--l") == ["--level"]
    assert bash_complete(d / "noded", "noded", "run", "--dur") == ["--duration"]
    assert bash_complete(d / "nodectl", "nodectl", "model", "f") == ["fit"]  # a positional's choices


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_takes_the_completion_functions(made):
    for script in (made / "zsh/site-functions").iterdir():
        subprocess.run(["zsh", "-n", str(script)], check=True, timeout=30)


@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")
def test_man_renders_the_pages_without_a_warning(made):
    for page in (made / "man/man1").iterdir():
        p = subprocess.run(["man", "--warnings", "-l", str(page)], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "MANPAGER": "cat", "LC_ALL": "C.UTF-8", "MANWIDTH": "100"})
        assert p.returncode == 0 and p.stderr == "", p.stderr
        assert "COMMANDS" in p.stdout
