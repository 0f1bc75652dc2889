"""tests/cli/help_flags.py LOOM [EXE] — every flag a subcommand's parser accepts is listed in its --help,
and every flag its --help lists as an option is one the parser accepts.

The parser's flags are the C string literals that are a flag and nothing else ("--steps",
"--data=", "-o") in tools/cmd_NAME.c and the shared parsers it calls (train_args.c,
sample_args.c, args.c's pass hooks); literals that build another program's command line
(cmd_check.c's add/addf) or JSON values are not flags.  The help's options are the flags in
its usage lines and in the first column of its indented option lines ("  --lr X --min-lr X   text").
EXE, an executable `loom compile` wrote: the same for tools/runner/runner.c against `EXE --help`
(its fixed[] flags are refused as compiled in) and for `EXE sample --help` (a compact list: every
flag its text names).
Prints one line per problem; exit 1 if any."""
import os, re, subprocess, sys

loom = sys.argv[1]
LIT = re.compile(r'"(--?[a-zA-Z][a-zA-Z0-9-]*)=?"')
FLAG = re.compile(r'(?<![\w-])(--?[a-zA-Z][a-zA-Z0-9-]*)')
# Accepted but deliberately not listed, each with the reason its refusal gives.
UNLISTED = {("train", "--arch"): "refused with a pointer to 'loom compile --arch'",
            ("train", "-o"): "refused with a pointer to 'loom compile' and --out"}


def source(path):
    return re.sub(r'/\*.*?\*/', '', open(path).read(), flags=re.S)


def literals(src):
    out = set()
    for line in src.split('\n'):
        if re.search(r'\badd[f]?\(|json_string', line): continue
        out |= set(LIT.findall(line))
    return out


args = source('tools/args.c')
shared = {'train_args_parse': literals(source('tools/train_args.c')),
          'sample_arg(': literals(source('tools/sample_args.c')),
          'pass_hook_arg': literals(args[args.index('int pass_hook_arg'):])}
shared['train_args_parse'] |= shared['pass_hook_arg']   # train_args.c calls pass_hook_arg


def listed(help_text, compact=False):
    """compact: an option line may hold several options, each two spaces after the last
    ("--seed S (1337)  --ids (print token ids)  --threads N")"""
    out = set()
    for line in help_text.split('\n'):
        if re.match(r'examples?:', line): break   # command lines, not options
        if re.match(r'\s*usage:|\s+loom \w', line) and not line.startswith('  loom '):
            out |= set(FLAG.findall(line))
        elif compact and re.match(r'\s+-', line):
            for seg in re.split(r'\s{2,}', line.strip()):
                if seg.startswith('-'): out |= set(FLAG.findall(seg.split('(')[0]))
        elif re.match(r'\s+-', line):
            out |= set(FLAG.findall(re.split(r"(?<=\S)\s{2,}", line.strip(), maxsplit=1)[0] + ' '))
    return out


def help_of(cmd):
    h = subprocess.run([loom, cmd, '--help'], capture_output=True, text=True)
    if h.returncode != 0: print(f"loom {cmd} --help: exit {h.returncode}"); return None
    return h.stdout


bad = 0
cmds = 0
for f in sorted(os.listdir('tools')):
    m = re.match(r'cmd_(.*)\.c$', f)
    if not m: continue
    cmd = m.group(1).replace('_', '-')
    src = source('tools/' + f)
    parsed = literals(src)
    for call, flags in shared.items():
        if call in src: parsed |= flags
    text = help_of(cmd)
    if text is None: bad += 1; continue
    shown = listed(text)
    if cmd == 'compile':   # "It takes the same options as 'loom train'"
        shown |= listed(help_of('train') or '')
    cmds += 1
    for flag in sorted(parsed - shown):
        if (cmd, flag) in UNLISTED: continue
        print(f"loom {cmd}: {flag} is accepted but 'loom {cmd} --help' does not list it"); bad += 1
    for flag in sorted(x for x in shown - parsed if x != '-'):
        print(f"loom {cmd}: 'loom {cmd} --help' lists {flag}, which the parser does not accept"); bad += 1


def compare(name, parsed, shown):
    global bad
    for flag in sorted(parsed - shown):
        print(f"{name}: {flag} is accepted but '{name} --help' does not list it"); bad += 1
    for flag in sorted(x for x in shown - parsed if x != '-'):
        print(f"{name}: '{name} --help' lists {flag}, which the parser does not accept"); bad += 1


if len(sys.argv) > 2:
    exe = sys.argv[2]
    src = re.sub(r'fixed\[\] = \{.*?\};', '', source('tools/runner/runner.c'), flags=re.S)
    # the function that parses `EXE sample` (it calls sample_arg) is not the trainer's parser
    at = src.index('sample_arg(')
    start, end = src.rindex('\nstatic int ', 0, at), src.index('\n}\n', at)
    h = subprocess.run([exe, '--help'], capture_output=True, text=True).stdout
    compare('EXE', literals(src[:start] + src[end:]), listed(h, compact=True))
    h = subprocess.run([exe, 'sample', '--help'], capture_output=True, text=True).stdout
    compare('EXE sample', shared['sample_arg('] | literals(src[start:end]), listed(h, compact=True))
    cmds += 2
print(f"help_flags: {cmds} commands checked, {bad} problems")
sys.exit(1 if bad or cmds < 12 else 0)
