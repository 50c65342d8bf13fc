// Reads TensorBoard event files with packages that share no code with ncf_dist:
// tfrecord's RecordReader walks the TFRecord frames and checks both masked
// CRC-32Cs of each, protobufjs decodes each record as event.proto's
// tensorflow.Event. Prints one JSON line per record, in file order:
//   {"file", "step", "wall_time", "file_version"}            the first record
//   {"file", "step", "wall_time", "tag", "value"}            each summary value
//   {"file", "step", "wall_time", "session_log"}             a session log
// Any bad frame, undecodable record or unexpected field ends it with exit 1.
//   NODE_PATH=DIR/node_modules node read_events.js FILE...
'use strict';
const path = require('path');
const protobuf = require('protobufjs');
const tfrecord = require('tfrecord');

async function readFile(file, Event) {
  const reader = await tfrecord.RecordReader.create(file);
  const lines = [];
  for (let index = 0;; ++index) {
    const record = await reader.readRecord();  // throws on a bad CRC or a short frame
    if (record === null) break;
    const e = Event.toObject(Event.decode(record), {longs: Number, enums: String});
    const head = {file: path.basename(file), step: e.step || 0, wall_time: e.wall_time || 0};
    if (e.file_version !== undefined) {
      lines.push(Object.assign(head, {file_version: e.file_version}));
    } else if (e.summary !== undefined) {
      for (const v of e.summary.value || []) {
        if (v.simple_value === undefined) throw new Error(`${file}: record ${index}: no simple_value`);
        lines.push(Object.assign({}, head, {tag: v.tag, value: v.simple_value}));
      }
    } else if (e.session_log !== undefined) {
      lines.push(Object.assign(head, {session_log: e.session_log.status}));
    } else {
      throw new Error(`${file}: record ${index}: an event with nothing in it`);
    }
  }
  await reader.close();
  return lines;
}

async function main() {
  const files = process.argv.slice(2);
  if (files.length === 0) throw new Error('usage: read_events.js FILE...');
  const root = new protobuf.Root().loadSync(path.join(__dirname, 'event.proto'), {keepCase: true});
  const Event = root.lookupType('tensorflow.Event');
  for (const file of files)
    for (const line of await readFile(file, Event)) process.stdout.write(JSON.stringify(line) + '\n');
}

main().catch((err) => {
  process.stderr.write(`read_events.js: ${err.message}\n`);
  process.exit(1);
});
