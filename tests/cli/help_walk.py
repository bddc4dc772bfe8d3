"""The leaf commands of `concord` with their --help text, for the CLI tests (lib.sh): every
command that has no subcommands of its own, under the chosen top-level commands (mode INCLUDE)
or under all but them (mode EXCLUDE)."""
import re
import subprocess


def help_of(concord, words):
    return subprocess.run([concord, *words, "--help"], capture_output=True, text=True).stdout


def leaves(concord, mode, chosen, words=()):
    words = list(words)
    text = help_of(concord, words)
    subs = []
    if "\nSubcommands:\n" in text:
        for line in text.split("\nSubcommands:\n", 1)[1].splitlines():
            m = re.match(r"^  (\S+)\s", line)
            if not m:
                break
            subs.append(m.group(1))
    if not subs:
        yield words, text
    for s in subs:
        if words == [] and ((mode == "INCLUDE") != (s in chosen)):
            continue
        yield from leaves(concord, mode, chosen, words + [s])
