#!/usr/bin/env python3
"""The house's size, measured the one way the issues and closing notes use.

Counts every tracked `.rs` file under a crate's `src/` (not `tests/`, `benches/`,
`examples/` or `fuzz/`), each file cut at its first `#[cfg(test)]` line, and prints the
non-test lines, the files over 500 lines, the functions over 60 lines and the names at
`server-runtime`'s root (re-exports plus public modules and items; what an inline
module such as the prelude lists is that module's, not the root's). `-v` lists the big files and long functions.

    python3 .ci/house.py [-v] [ROOT]
"""
import os
import re
import subprocess
import sys

FN = re.compile(r'^(\s*)(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)')


def source_files(root):
    out = subprocess.run(['git', '-C', root, 'ls-files', '*.rs'],
                         capture_output=True, text=True, check=True).stdout.split()
    for path in out:
        parts = path.split('/')
        if 'src' not in parts:
            continue
        crate = parts[:parts.index('src')]
        if any(p in ('tests', 'benches', 'examples', 'fuzz') for p in crate):
            continue
        if os.path.exists(os.path.join(root, *crate, 'Cargo.toml')):
            yield path


def non_test_lines(root, path):
    with open(os.path.join(root, path), encoding='utf8', errors='replace') as f:
        lines = f.read().split('\n')
    if lines and lines[-1] == '':
        lines.pop()
    for i, line in enumerate(lines):
        if line.strip().startswith('#[cfg(test)]'):
            return lines[:i]
    return lines


def long_functions(lines):
    found = []
    for i, line in enumerate(lines):
        m = FN.match(line)
        if not m:
            continue
        j = i
        while j < len(lines) and not lines[j].rstrip().endswith(('{', ';')):
            j += 1
        if j == len(lines) or not lines[j].rstrip().endswith('{'):
            continue
        end = j + 1
        while end < len(lines) and lines[end].rstrip() != m.group(1) + '}':
            end += 1
        if end - i + 1 > 60:
            found.append((end - i + 1, m.group(7)))
    return found


def root_names(root):
    with open(os.path.join(root, 'server-runtime/src/lib.rs'), encoding='utf8') as f:
        src = f.read().split('#[cfg(test)]')[0]
    src = re.sub(r'//[^\n]*', '', src)
    src = re.sub(r'pub mod \w+\s*\{.*?\n\}', '', src, flags=re.S)
    names = set()
    for m in re.finditer(r'pub use\s+([^;]+);', src):
        body = m.group(1)
        if '{' in body:
            inner = re.sub(r'[{}]', ',', body[body.index('{') + 1:body.rindex('}')])
            leaves = [p for p in inner.split(',') if p.strip()]
        else:
            leaves = [body]
        for leaf in leaves:
            name = leaf.strip().split(' as ')[-1].split('::')[-1].strip()
            if name and name != 'self' and name != '*':
                names.add(name)
    names.update(re.findall(r'^pub (?:mod|fn|async fn|struct|enum|trait|const|type|static) (\w+)', src, re.M))
    return names


def main():
    args = [a for a in sys.argv[1:] if a != '-v']
    root = args[0] if args else '.'
    total, big, long_fns = 0, [], []
    for path in source_files(root):
        lines = non_test_lines(root, path)
        total += len(lines)
        if len(lines) > 500:
            big.append((len(lines), path))
        long_fns += [(n, path, name) for n, name in long_functions(lines)]
    print(f'non-test lines: {total}')
    print(f'files over 500 lines: {len(big)}')
    print(f'functions over 60 lines: {len(long_fns)}')
    print(f'server-runtime root names: {len(root_names(root))}')
    if '-v' in sys.argv:
        for n, path in sorted(big, reverse=True):
            print(f'  {n:5} {path}')
        for n, path, name in sorted(long_fns, reverse=True):
            print(f'  {n:5} {path} fn {name}')


if __name__ == '__main__':
    main()
