"""Shell completion (bash, zsh) and man pages, made from noded's and nodectl's own parsers.

What a completion offers and what a man page lists are read from the argparse parsers the
commands run with (``noded.commands.cli.build_parser``, ``noded.admin.nodectl.build_parser``), so a
new subcommand or option is in both without anyone writing it twice.

    python -m noded.commands.clidoc OUTDIR   # OUTDIR/bash-completion/completions/{noded,nodectl},
                                    # OUTDIR/zsh/site-functions/{_noded,_nodectl}, OUTDIR/man/man1/{noded,nodectl}.1

(``make cli-docs`` writes them into build/cli; ``make install`` into /usr/local/share.)
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from dataclasses import dataclass

from noded.util.buildinfo import source_date_epoch


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]  # -v, --verbose
    help: str
    takes_value: bool
    choices: tuple[str, ...]
    metavar: str | None


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    description: str
    options: tuple[Option, ...]
    positionals: tuple[tuple[str, str, tuple[str, ...]], ...]  # (name, help, choices)


@dataclass(frozen=True)
class Program:
    prog: str
    description: str
    options: tuple[Option, ...]  # the top level's (before the command)
    commands: tuple[Command, ...]


def _text(s: str | None) -> str:
    return " ".join((s or "").replace("%(default)s", "").split())


def _options(parser: argparse.ArgumentParser) -> tuple[Option, ...]:
    out = []
    for a in parser._actions:
        if not a.option_strings or a.help == argparse.SUPPRESS:
            continue
        out.append(Option(tuple(a.option_strings), _text(a.help), a.nargs != 0,
                          tuple(map(str, a.choices)) if a.choices else (),
                          a.metavar if isinstance(a.metavar, str) else None))
    return tuple(out)


def _positionals(parser: argparse.ArgumentParser) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    return tuple((a.metavar if isinstance(a.metavar, str) else a.dest, _text(a.help),
                  tuple(map(str, a.choices)) if a.choices else ())
                 for a in parser._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction))


def program(parser: argparse.ArgumentParser) -> Program:
    """What a completion and a man page need of ``parser`` (subcommands and options)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: _text(c.help) for c in sub._choices_actions}
    commands = tuple(Command(name, helps.get(name, ""), _text(p.description) or helps.get(name, ""), _options(p),
                             _positionals(p)) for name, p in sub.choices.items())
    return Program(parser.prog, _text(parser.description), _options(parser), commands)


#: options and arguments that name a file or directory: completed with paths; any other
#: value (a level, a duration, a job id) has nothing a shell could list
PATH_VALUES = frozenset({"--config", "--socket", "--state-dir", "--workdir", "--profile", "--scenario", "file",
                         "scenario"})


def _words(items) -> str:
    return " ".join(dict.fromkeys(items))


def bash_completion(p: Program) -> str:
    """A bash completion function: the command first, then its options; an option's
    choices after it; files where an option or argument takes a value it cannot list."""
    fn = "_" + p.prog.replace("-", "_")
    top = _words(f for o in p.options for f in o.flags)
    lines = [f"# bash completion for {p.prog}, made from its parser by noded.commands.clidoc: do not edit",
             f"{fn}() {{",
             '    local cur prev cmd i',
             '    cur="${COMP_WORDS[COMP_CWORD]}"; prev="${COMP_WORDS[COMP_CWORD-1]}"; cmd=""',
             '    for ((i = 1; i < COMP_CWORD; i++)); do',
             '        case "${COMP_WORDS[i]}" in',
             f'            {"|".join(c.name for c in p.commands)}) cmd="${{COMP_WORDS[i]}}"; break;;',
             '        esac',
             '    done',
             '    case "$prev" in']
    valued = {}
    for c in p.commands:
        for o in c.options:
            if o.takes_value:
                valued.setdefault(o.flags, o.choices)
    for o in p.options:
        if o.takes_value:
            valued.setdefault(o.flags, o.choices)
    for flags, choices in valued.items():
        reply = f'COMPREPLY=($(compgen -W "{_words(choices)}" -- "$cur"))' if choices else \
            'COMPREPLY=($(compgen -f -- "$cur"))' if PATH_VALUES & set(flags) else 'COMPREPLY=()'
        lines.append(f'        {"|".join(flags)}) {reply}; return;;')
    lines += ['    esac', '    case "$cmd" in']
    for c in p.commands:
        words = [f for o in c.options for f in o.flags] + [ch for _, _, chs in c.positionals for ch in chs]
        files = any(n in PATH_VALUES for n, _, _ in c.positionals)
        lines.append(f'        {c.name}) COMPREPLY=($(compgen -W "{_words(words + top.split())}" -- "$cur"))'
                     + ('; [[ "$cur" != -* ]] && COMPREPLY+=($(compgen -f -- "$cur"))' if files else "") + ";;")
    lines += [f'        *) COMPREPLY=($(compgen -W "{_words(c.name for c in p.commands)} {top}" -- "$cur"));;',
              '    esac', '}', f"complete -F {fn} {p.prog}", ""]
    return "\n".join(lines)


def _zsh_quote(s: str) -> str:
    return s.replace("\\", "\\\\").replace("'", "'\\''").replace("[", "\\[").replace("]", "\\]").replace(":", "\\:")


def _zsh_spec(o: Option) -> str:
    value = ""
    if o.takes_value:
        value = f":{_zsh_quote(o.metavar or o.flags[-1].lstrip('-'))}:" + (
            f"({' '.join(o.choices)})" if o.choices else "_files" if PATH_VALUES & set(o.flags) else " ")
    text = _zsh_quote(o.help[:80])
    if len(o.flags) == 1:
        return f"'{o.flags[0]}[{text}]{value}'"
    return f"'({' '.join(o.flags)})'{{{','.join(o.flags)}}}'[{text}]{value}'"


def zsh_completion(p: Program) -> str:
    fn = "_" + p.prog.replace("-", "_")
    lines = [f"#compdef {p.prog}", f"# zsh completion for {p.prog}, made from its parser by noded.commands.clidoc: do not edit",
             f"{fn}() {{", "    local -a commands", "    commands=("]
    lines += [f"        '{c.name}:{_zsh_quote(c.help[:80])}'" for c in p.commands]
    lines += ["    )", "    local curcontext=\"$curcontext\" state line", "    typeset -A opt_args",
              "    _arguments -C \\"]
    lines += [f"        {_zsh_spec(o)} \\" for o in p.options]
    lines += ["        '1: :->command' \\", "        '*:: :->args'", "    case $state in",
              "        command) _describe -t commands 'command' commands ;;", "        args)",
              "            case $line[1] in"]
    for c in p.commands:
        specs = [_zsh_spec(o) for o in c.options + p.options]
        specs += [f"'*:{_zsh_quote(n)}:({' '.join(chs)})'" if chs else
                  f"'*:{_zsh_quote(n)}:{'_files' if n in PATH_VALUES else ' '}'" for n, _, chs in c.positionals]
        specs = list(dict.fromkeys(specs))
        lines.append(f"                {c.name}) _arguments {' '.join(specs)} ;;")
    lines += ["            esac ;;", "    esac", "}", f'{fn} "$@"', ""]
    return "\n".join(lines)


def _roff(s: str) -> str:
    s = s.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(("\\&" + line) if line.startswith((".", "'")) else line for line in s.split("\n"))


def _option_item(o: Option) -> list[str]:
    head = ", ".join(f"\\fB{_roff(f)}\\fR" for f in o.flags)
    if o.takes_value:
        head += f" \\fI{_roff(o.metavar or '{' + ','.join(o.choices) + '}' if o.choices else o.metavar or 'VALUE')}\\fR"
    return [".TP", head, _roff(o.help) or "(no description)"]


def man_page(p: Program, section: str = "1", date: str | None = None) -> str:
    epoch = source_date_epoch() if date is None else None  # ValueError: named, before anything is written
    date = date or (datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%d")
                    if epoch is not None else "2026-11-26")
    out = [f'.TH {p.prog.upper()} {section} "{date}" "noded" "noded manual"',
           ".SH NAME", f"{p.prog} \\- {_roff(p.description or p.prog)}",
           ".SH SYNOPSIS", f"\\fB{p.prog}\\fR [\\fIOPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]",
           ".SH DESCRIPTION", _roff(p.description), ".SH OPTIONS"]
    for o in p.options:
        out += _option_item(o)
    out.append(".SH COMMANDS")
    for c in p.commands:
        args = " ".join(f"\\fI{_roff(n.upper())}\\fR" for n, _, _ in c.positionals)
        out += [".SS " + f"{c.name}" + (f" {args}" if args else ""), _roff(c.description)]
        for n, h, chs in c.positionals:
            out += [".TP", f"\\fI{_roff(n.upper())}\\fR", _roff(h + (f" (one of: {', '.join(chs)})" if chs else ""))]
        for o in c.options:
            out += _option_item(o)
    out += [".SH SEE ALSO", "\\fBnoded\\fR(1), \\fBnodectl\\fR(1), /usr/local/share/doc/noded/README.md"]
    return "\n".join(out) + "\n"


def programs() -> list[Program]:
    from noded.admin.nodectl import build_parser as nodectl_parser
    from noded.commands.cli import build_parser as noded_parser

    return [program(noded_parser()), program(nodectl_parser())]


def write_all(outdir: str) -> list[str]:
    """Every completion and man page, under ``outdir``; returns the paths written."""
    written = []
    for p in programs():
        for rel, text in ((f"bash-completion/completions/{p.prog}", bash_completion(p)),
                          (f"zsh/site-functions/_{p.prog}", zsh_completion(p)),
                          (f"man/man1/{p.prog}.1", man_page(p))):
            path = os.path.join(outdir, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m noded.commands.clidoc OUTDIR", file=sys.stderr)
        return 2
    try:
        source_date_epoch()  # a malformed value fails here, before any file is written
    except ValueError as e:
        print(f"clidoc: {e}", file=sys.stderr)
        return 2
    for path in write_all(args[0]):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
