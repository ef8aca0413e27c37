// textmate_check.js: editors/vscode's TextMate grammar applied to sample.shard (tests/unit/editors.cmake).
//   node textmate_check.js GRAMMAR SAMPLE
// The grammar uses `match` rules only (with `include`s and nested `patterns`), so TextMate's rule
// for them is enough here: at each position the pattern whose match starts first wins, the earlier
// pattern on a tie; its `name` and `captures` give the scopes; the scan goes on after the match.
// Every regex must compile (JavaScript's syntax agrees with Oniguruma's on the forms used). Prints
// `line:col word: scope ok|want SCOPE` per expected position (counted by hand, as vim_check.vim's)
// and exits 1 on any mismatch.
'use strict';
const fs = require('fs');
const [grammarPath, samplePath] = process.argv.slice(2);
const g = JSON.parse(fs.readFileSync(grammarPath, 'utf8'));

function flatten(patterns, out) {
  for (const p of patterns) {
    if (p.include) flatten([g.repository[p.include.slice(1)]], out);
    else if (p.patterns && !p.match) flatten(p.patterns, out);
    else out.push({ re: new RegExp(p.match, 'g'), name: p.name, captures: p.captures });
  }
  return out;
}
const rules = flatten(g.patterns, []);

// scopes[line][col] = the innermost scope name there
const lines = fs.readFileSync(samplePath, 'utf8').split('\n');
const scopes = lines.map((text) => {
  const at = new Array(text.length + 1).fill('');
  for (let pos = 0; pos < text.length;) {
    let best = null;
    for (const r of rules) {
      r.re.lastIndex = pos;
      const m = r.re.exec(text);
      if (m && m[0].length > 0 && (!best || m.index < best.m.index)) best = { r, m };
    }
    if (!best) break;
    const { r, m } = best;
    for (let i = m.index; i < m.index + m[0].length; i++) at[i] = r.name || '';
    if (r.captures)
      for (const [k, c] of Object.entries(r.captures)) {
        if (m[k] === undefined) continue;
        const start = m.index + m[0].indexOf(m[k]);
        for (let i = start; i < start + m[k].length; i++) at[i] = c.name;
      }
    pos = m.index + m[0].length;
  }
  return at;
});

const want = [
  [1, 1, '#', 'comment.line.number-sign.shard'], [3, 1, 'import', 'keyword.other.declaration.shard'],
  [3, 8, '"targets"', 'string.quoted.double.shard'], [5, 1, 'mesh', 'keyword.other.declaration.shard'],
  [5, 23, '2', 'constant.numeric.shard'], [6, 47, '1_024', 'constant.numeric.shard'],
  [13, 15, 'bf16', 'storage.type.dtype.shard'], [15, 3, 'fn', 'keyword.other.declaration.shard'],
  [15, 42, '->', 'keyword.operator.arrow.shard'], [16, 5, 'let', 'keyword.control.shard'],
  [16, 13, 'gelu', 'support.function.builtin.shard'], [16, 20, '@', 'keyword.operator.contract.shard'],
  [16, 30, '0.5', 'constant.numeric.shard'], [17, 5, 'return', 'keyword.control.shard'],
  [21, 1, 'train', 'keyword.other.declaration.shard'], [22, 3, 'loss', 'variable.parameter.step-key.shard'],
  [24, 8, '3e-4', 'constant.numeric.shard'],
];
let bad = 0;
for (const [l, c, word, scope] of want) {
  const got = scopes[l - 1][c - 1];
  if (got !== scope) bad++;
  console.log(`${l}:${c} ${word}: ${got} ${got === scope ? 'ok' : 'want ' + scope}`);
}
console.log(bad ? `${bad} wrong` : 'all ok');
process.exit(bad ? 1 : 0);
