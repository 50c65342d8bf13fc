// Scores (user, item) pairs with an exported NeuMF in ONNX Runtime (Node).
//   node score_pairs.js MODEL.onnx PAIRS.csv OUT.csv
// PAIRS.csv: 'user,item' lines of dense ids (a 'user,item' header allowed).
// OUT.csv: 'user,item,score,logit', one line per pair in input order.
'use strict';
const fs = require('fs');
const ort = require('onnxruntime-node');

async function main() {
  const [model, pairsPath, outPath] = process.argv.slice(2);
  if (!outPath) throw new Error('usage: node score_pairs.js MODEL PAIRS OUT');
  const users = [];
  const items = [];
  fs.readFileSync(pairsPath, 'utf8').split('\n').forEach((line, k) => {
    const t = line.trim();
    if (t === '' || (k === 0 && t === 'user,item')) return;
    const [u, i] = t.split(',');
    users.push(BigInt(u));
    items.push(BigInt(i));
  });
  const session = await ort.InferenceSession.create(model);
  const n = users.length;
  const feeds = {
    user: new ort.Tensor('int64', BigInt64Array.from(users), [n]),
    item: new ort.Tensor('int64', BigInt64Array.from(items), [n]),
  };
  const out = await session.run(feeds);
  const lines = ['user,item,score,logit'];
  for (let k = 0; k < n; ++k)
    lines.push(`${users[k]},${items[k]},${out.score.data[k].toPrecision(9)},` +
               `${out.logit.data[k].toPrecision(9)}`);
  fs.writeFileSync(outPath, lines.join('\n') + '\n');
  console.log(`score_pairs: ${n} pairs with onnxruntime-node ${require('onnxruntime-node/package.json').version}`);
}

main().catch((e) => {
  console.error(`score_pairs: error: ${e.message}`);
  process.exit(1);
});
