"""Shell completion: ``completion bash|zsh`` scripts and the ``__complete`` protocol behind them.

The scripts ask the program itself (``gpushare __complete WORDS...``) for candidates, so they
never go stale. ``kubectl gpushare <TAB>`` works through kubectl (1.26 and newer), which runs
``kubectl_complete-gpushare WORDS...`` and reads the same answer: one candidate a line, then
``:4`` (cobra's "no file completion" directive). Candidates come from the argparse parser:
subcommands, flags, and the choices of the flag being completed.
"""

import argparse

DIRECTIVE_NO_FILES = ":4"
DIRECTIVE_DEFAULT = ":0"
"""Let the shell complete file names (for --kubeconfig)."""

BASH = """# bash completion for {prog}; load with: source <({prog} completion bash)
_gpushare_complete() {{
  local IFS=$'\\n' words
  words=$("${{COMP_WORDS[0]}}" __complete "${{COMP_WORDS[@]:1:COMP_CWORD}}" 2>/dev/null)
  COMPREPLY=($(printf '%s\\n' "$words" | grep -v '^:'))
  if printf '%s\\n' "$words" | grep -qx ':0'; then
    COMPREPLY+=($(compgen -f -- "${{COMP_WORDS[COMP_CWORD]}}"))
  fi
}}
complete -F _gpushare_complete gpushare kubectl-gpushare
"""

ZSH = """#compdef gpushare kubectl-gpushare
# zsh completion for {prog}; load with: source <({prog} completion zsh)
_gpushare() {{
  local -a lines candidates
  lines=("${{(@f)$("${{words[1]}}" __complete "${{(@)words[2,CURRENT]}}" 2>/dev/null)}}")
  candidates=(${{lines:#:*}})
  compadd -- $candidates
  if (( ${{lines[(Ie):0]}} )); then _files; fi
}}
if [[ "$funcstack[1]" == "_gpushare" ]]; then
  _gpushare "$@"
else
  compdef _gpushare gpushare kubectl-gpushare
fi
"""

SCRIPTS = {"bash": BASH, "zsh": ZSH}
FILE_FLAGS = ("--kubeconfig",)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps no public list of subcommands
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    for action in parser._actions:
        if flag in action.option_strings:
            return action
    return None


def candidates(parser: argparse.ArgumentParser, words: list[str]) -> tuple[list[str], str]:
    """Completions for the last of ``words`` (the one being typed, possibly empty) after the
    program name, and the directive for the shell."""
    *done, current = words or [""]
    active = parser
    expect: argparse.Action | None = None
    for word in done:
        if expect is not None:
            expect = None
            continue
        subs = _subparsers(active)
        if word in subs:
            active = subs[word]
            continue
        if word.startswith("-") and "=" not in word:
            action = _option(active, word)
            if action is not None and action.nargs != 0:
                expect = action
    if expect is not None:
        if expect.choices:
            return sorted(str(c) for c in expect.choices if str(c).startswith(current)), (
                DIRECTIVE_NO_FILES
            )
        if any(f in expect.option_strings for f in FILE_FLAGS):
            return [], DIRECTIVE_DEFAULT
        return [], DIRECTIVE_NO_FILES
    if current.startswith("-"):
        flags = [
            flag
            for action in active._actions
            if action.help != argparse.SUPPRESS
            for flag in action.option_strings
        ]
        return sorted(f for f in flags if f.startswith(current)), DIRECTIVE_NO_FILES
    names = [name for name in _subparsers(active) if not name.startswith("_")]
    for action in active._positionals._group_actions:
        if action.choices and not isinstance(action, argparse._SubParsersAction):
            names += [str(c) for c in action.choices]
    return sorted(n for n in names if n.startswith(current)), DIRECTIVE_NO_FILES


def script(shell: str, *, prog: str) -> str:
    return SCRIPTS[shell].format(prog=prog)
