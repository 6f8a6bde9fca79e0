/**
 * What the model sees, through pi's real agent loop (a scripted model on loopback): stdout and
 * stderr told apart in a bash result, each stream's truncation said; and headless failures that
 * are loud (stderr, a non-zero exit) instead of a silent exit 0.
 */
import assert from "node:assert/strict";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { FakeModel, type PiRun, piHome, piPrint, type Reply } from "./fake-model.ts";
import { SANDBOX_BIN, tempDir } from "./helpers.ts";

async function run(workspace: string, home: string, dataDir: string, flags: string[]): Promise<PiRun> {
	return piPrint(workspace, { ...process.env, HOME: home, SANDBOX_BIN, SANDBOX_DATA_DIR: dataDir, SANDBOX_MODE: "auto" }, "go", flags);
}

describe("what the model sees", () => {
	let workspace: string;
	let home: string;
	let dataDir: string;
	before(() => {
		workspace = tempDir("pi-view-ws-");
		home = tempDir("pi-view-home-");
		dataDir = tempDir("pi-view-data-");
	});
	after(() => {
		for (const dir of [workspace, home, dataDir]) rmSync(dir, { recursive: true, force: true });
	});

	it("bash results keep stdout and stderr apart, and say when a stream was cut", async () => {
		const replies: Reply[] = [
			{ toolCalls: [{ name: "bash", args: { command: "echo out; echo err >&2; exit 3" } }] },
			{ toolCalls: [{ name: "bash", args: { command: "echo only-out" } }] },
			{ toolCalls: [{ name: "bash", args: { command: "echo small; seq 1 100000 >&2" } }] },
			{ text: "done" },
		];
		const model = await FakeModel.start(replies);
		try {
			piHome(home, model);
			const ran = await run(workspace, home, dataDir, []);
			assert.equal(ran.code, 0, ran.stderr);
			const [mixed, plain, flood] = model.toolResults();
			assert.match(mixed ?? "", /^out\n\n\[stderr\]\nerr\n\nCommand exited with code 3$/, mixed);
			assert.equal(plain?.trim(), "only-out"); // stdout only: pi's own text
			assert.match(flood ?? "", /^small\n\n\[stderr\]\n/);
			assert.match(flood ?? "", /\[stderr: the last \d+ of 588895 bytes are shown\]/);
			assert.match(flood ?? "", /\n100000\n/); // the tail of stderr, not its head
		} finally {
			await model.close();
		}
	});

	it("a second failed edit of a file in a turn stops pi's loop (terminate), the first says to Read again", async () => {
		writeFileSync(path.join(workspace, "loop.txt"), "hello\n");
		const edit = (oldText: string) => ({ toolCalls: [{ name: "edit", args: { path: "loop.txt", edits: [{ oldText, newText: "x" }] } }] });
		const model = await FakeModel.start([edit("nope"), edit("nope again"), { text: "never asked" }]);
		try {
			piHome(home, model);
			const ran = await run(workspace, home, dataDir, []);
			assert.equal(ran.code, 0, ran.stderr);
			// Two model turns: the one that asked for each edit. The second failure ended the loop.
			assert.equal(model.requests.length, 2, JSON.stringify(model.toolResults()));
			const [first] = model.toolResults();
			assert.match(first ?? "", /Could not find .*\n\[a failed edit of loop\.txt: Read the file once more/s);
			assert.equal(readFileSync(path.join(workspace, "loop.txt"), "utf8"), "hello\n");
		} finally {
			await model.close();
		}
	});

	it("a second failed patch command in a turn stops pi's loop with the server's note", async () => {
		const bash = (command: string) => ({ toolCalls: [{ name: "bash", args: { command } }] });
		const model = await FakeModel.start([bash("git apply missing.diff"), bash("git apply missing.diff"), { text: "never asked" }]);
		try {
			piHome(home, model);
			const ran = await run(workspace, home, dataDir, []);
			assert.equal(ran.code, 0, ran.stderr);
			assert.equal(model.requests.length, 2, JSON.stringify(model.toolResults()));
			assert.match(model.toolResults()[0] ?? "", /can't open patch/);
		} finally {
			await model.close();
		}
	});

	it("headless, a sandbox that cannot start is said once on stderr and pi exits non-zero", async () => {
		const model = await FakeModel.start([{ toolCalls: [{ name: "bash", args: { command: "true" } }] }, { text: "done" }]);
		try {
			piHome(home, model);
			const missing = await run(workspace, home, dataDir, ["--sandbox-bin", path.join(workspace, "no-such-sandbox")]);
			assert.notEqual(missing.code, 0, missing.stderr);
			assert.equal(missing.stderr.match(/^sandbox: the sandbox is unavailable/gm)?.length, 1, missing.stderr);
			const invalid = await run(workspace, home, dataDir, ["--sandbox-mode", "yolo"]);
			assert.notEqual(invalid.code, 0, invalid.stderr);
			assert.match(invalid.stderr, /^sandbox: .*sandbox mode=yolo is not one of ask, accept-edits, auto/m);
		} finally {
			await model.close();
		}
	});
});
