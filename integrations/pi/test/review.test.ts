/**
 * Review, then apply (issue 11): an untrusted session's edits reach the workspace only through a
 * review. pi's real agent loop, driven by a scripted model on loopback, writes in the private
 * copy; headless, the changes are kept and their id printed; with a UI, `/sandbox review` shows
 * the diff and applies what the user picks, flagged entries only with consent.
 */
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { existsSync, readFileSync, rmSync } from "node:fs";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";
import { FAKE_MODEL, FAKE_PROVIDER, FakeModel, PI_CLI, piHome, piPrint, type Reply } from "./fake-model.ts";
import { SANDBOX_BIN, tempDir, waitFor } from "./helpers.ts";
import { loadExtension, scriptedUi } from "./support.ts";

const here = path.dirname(fileURLToPath(import.meta.url));
const extensionDir = path.resolve(here, "..");

type Message = Record<string, unknown>;

interface Dirs {
	workspace: string;
	home: string;
	dataDir: string;
}

function makeDirs(): Dirs {
	return { workspace: tempDir("pi-review-ws-"), home: tempDir("pi-review-home-"), dataDir: tempDir("pi-review-data-") };
}

function removeDirs(dirs: Dirs): void {
	for (const dir of Object.values(dirs)) rmSync(dir, { recursive: true, force: true });
}

function untrustedEnv(dirs: Dirs): NodeJS.ProcessEnv {
	return { ...process.env, HOME: dirs.home, SANDBOX_BIN, SANDBOX_DATA_DIR: dirs.dataDir, SANDBOX_PROFILE: "untrusted", SANDBOX_MODE: "auto" };
}

function keptChangesets(dirs: Dirs): Array<{ id: string; state: string; counts: Record<string, number> }> {
	const out = execFileSync(SANDBOX_BIN, ["changes", "list", "--json", "--workspace", dirs.workspace], {
		encoding: "utf8",
		env: { ...process.env, SANDBOX_DATA_DIR: dirs.dataDir },
	});
	return (JSON.parse(out) as { changesets: Array<{ id: string; state: string; counts: Record<string, number> }> }).changesets;
}

const WRITE_HELLO: Reply[] = [{ toolCalls: [{ name: "write", args: { path: "hello.txt", content: "hello from the model\n" } }] }, { text: "I wrote hello.txt." }];

describe("pi's agent loop in an untrusted session: review, then apply", () => {
	let dirs: Dirs;
	let model: FakeModel;
	before(async () => {
		dirs = makeDirs();
		model = await FakeModel.start(WRITE_HELLO);
		piHome(dirs.home, model);
	});
	after(async () => {
		await model.close();
		removeDirs(dirs);
	});

	it("headless (-p): the model's write lands in the private copy, is kept under an id, and applies later", async () => {
		const { code, stdout, stderr } = await piPrint(dirs.workspace, untrustedEnv(dirs), "write hello");
		assert.equal(code, 0, stderr);
		assert.match(stdout, /I wrote hello\.txt/);
		// The model was told where its write went; the workspace is untouched.
		assert.match(model.toolResults().join("\n"), /private copy/, JSON.stringify(model.toolResults()));
		assert.equal(existsSync(path.join(dirs.workspace, "hello.txt")), false);
		// Never discarded: kept, and its id printed with how to review and apply it.
		const id = /kept as (ch-[0-9a-f]{12})/.exec(stderr)?.[1];
		assert.ok(id, stderr);
		assert.match(stderr, new RegExp(`sandbox changes apply ${id}`));
		assert.deepEqual(
			keptChangesets(dirs).map((c) => [c.id, c.state, c.counts.added]),
			[[id, "kept", 1]],
		);
		execFileSync(SANDBOX_BIN, ["changes", "apply", id], { env: { ...process.env, SANDBOX_DATA_DIR: dirs.dataDir } });
		assert.equal(readFileSync(path.join(dirs.workspace, "hello.txt"), "utf8"), "hello from the model\n");
		rmSync(path.join(dirs.workspace, "hello.txt"));
	});

	it("pi --mode rpc: /sandbox review shows the diff of the model's edit, and Apply brings it to the workspace", async () => {
		const again = await FakeModel.start(WRITE_HELLO);
		const home = tempDir("pi-review-rpc-home-");
		piHome(home, again);
		const child = spawn(process.execPath, [PI_CLI, "--mode", "rpc", "--no-session", "--no-extensions", "-e", extensionDir, "--provider", FAKE_PROVIDER, "--model", FAKE_MODEL], {
			cwd: dirs.workspace,
			env: { ...untrustedEnv(dirs), HOME: home },
		});
		const seen: Message[] = [];
		const widgets: string[][] = [];
		const selects: Message[] = [];
		const send = (message: Message) => child.stdin.write(`${JSON.stringify(message)}\n`);
		createInterface({ input: child.stdout }).on("line", (line) => {
			let message: Message;
			try {
				message = JSON.parse(line) as Message;
			} catch {
				return;
			}
			seen.push(message);
			if (message.type !== "extension_ui_request") return;
			if (message.method === "setWidget" && Array.isArray(message.widgetLines)) widgets.push(message.widgetLines as string[]);
			if (message.method === "select") {
				selects.push(message);
				const options = message.options as string[];
				const pick = options.find((o) => o.startsWith("Apply")) ?? options[0];
				send({ type: "extension_ui_response", id: message.id, value: pick });
			}
		});
		const settled = () => seen.some((m) => m.type === "agent_settled");
		try {
			send({ id: "p1", type: "prompt", message: "write hello" });
			assert.ok(await waitFor(settled, 60_000), JSON.stringify(seen).slice(-2000));
			assert.equal(existsSync(path.join(dirs.workspace, "hello.txt")), false);

			send({ id: "p2", type: "prompt", message: "/sandbox review" });
			assert.ok(await waitFor(() => existsSync(path.join(dirs.workspace, "hello.txt")), 60_000), JSON.stringify(seen).slice(-2000));
			assert.equal(readFileSync(path.join(dirs.workspace, "hello.txt"), "utf8"), "hello from the model\n");
			const review = widgets.find((lines) => lines.some((l) => l.includes("hello.txt")));
			assert.ok(review, JSON.stringify(widgets));
			assert.ok(review.includes("+hello from the model"), review.join("\n"));
			assert.match(String(selects.at(-1)?.title), /apply the changes kept as ch-/);
			// Applied: nothing left to review.
			assert.deepEqual(
				keptChangesets(dirs).filter((c) => c.state !== "applied"),
				[],
			);
		} finally {
			child.stdin.end();
			const exited = new Promise((resolve) => child.once("exit", resolve));
			const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
			await exited;
			clearTimeout(timer);
			await again.close();
			rmSync(home, { recursive: true, force: true });
		}
	});
});

// -- the extension with a stand-in UI: consent for flagged entries, discard ----------------------

const REVIEW_FLAGS = { "sandbox-bin": SANDBOX_BIN, "sandbox-profile": "untrusted", "sandbox-mode": "auto" };

describe("/sandbox review with a UI", () => {
	let dirs: Dirs;
	before(() => {
		dirs = makeDirs();
		process.env.SANDBOX_DATA_DIR = dirs.dataDir;
	});
	after(() => removeDirs(dirs));

	it("holds flagged entries back until the user consents, then applies them from the kept changeset", async () => {
		const { tools, commands, emit } = loadExtension(REVIEW_FLAGS);
		const start = scriptedUi(dirs.workspace, []);
		await emit("session_start", { type: "session_start", reason: "startup" }, start.ctx);
		try {
			const write = tools.get("write");
			assert.ok(write);
			const wrote = await write.execute("w1", { path: "plain.txt", content: "plain\n" }, undefined, undefined, start.ctx);
			assert.match(JSON.stringify(wrote.content), /private copy/);
			await write.execute("w2", { path: ".prettierrc", content: "semi=false\n" }, undefined, undefined, start.ctx);

			const first = scriptedUi(dirs.workspace, [/^Apply the 1 unflagged/]);
			await commands.get("sandbox")?.handler("review", first.ctx);
			assert.equal(readFileSync(path.join(dirs.workspace, "plain.txt"), "utf8"), "plain\n");
			assert.equal(existsSync(path.join(dirs.workspace, ".prettierrc")), false, "a flagged dotfile needs consent");
			assert.match(first.notes.join("\n"), /held back \.prettierrc \[dotfile\]/);

			// The held-back part stays kept; a later review offers it, and "all" is consent.
			const second = scriptedUi(dirs.workspace, [/^Apply all 1, the 1 flagged/]);
			await commands.get("sandbox")?.handler("review", second.ctx);
			assert.match(second.asked.join("\n"), /apply the changes kept as ch-/);
			assert.equal(readFileSync(path.join(dirs.workspace, ".prettierrc"), "utf8"), "semi=false\n");
			assert.deepEqual(
				keptChangesets(dirs).map((c) => c.state),
				["applied"],
			);

			// The session started after the first review copied the workspace as it was then.
			const bash = tools.get("bash");
			assert.ok(bash);
			const cat = await bash.execute("b1", { command: "cat plain.txt" }, undefined, undefined, start.ctx);
			assert.match(JSON.stringify(cat.content), /"plain\\n/);
		} finally {
			await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, start.ctx);
		}
	});

	it("Discard leaves the workspace as it was and removes the changeset; dismissing keeps it", async () => {
		const { tools, commands, emit } = loadExtension(REVIEW_FLAGS);
		const start = scriptedUi(dirs.workspace, []);
		await emit("session_start", { type: "session_start", reason: "startup" }, start.ctx);
		try {
			await tools.get("write")?.execute("w1", { path: "dropped.txt", content: "no\n" }, undefined, undefined, start.ctx);
			const dismissed = scriptedUi(dirs.workspace, []);
			await commands.get("sandbox")?.handler("review", dismissed.ctx);
			assert.match(dismissed.notes.join("\n"), /kept ch-/);
			const kept = keptChangesets(dirs).filter((c) => c.state === "kept");
			assert.equal(kept.length, 1);

			const discard = scriptedUi(dirs.workspace, [/^Discard/]);
			await commands.get("sandbox")?.handler("review", discard.ctx);
			assert.match(discard.notes.join("\n"), /discarded ch-/);
			assert.equal(existsSync(path.join(dirs.workspace, "dropped.txt")), false);
			assert.deepEqual(
				keptChangesets(dirs).filter((c) => c.state === "kept"),
				[],
			);
		} finally {
			await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, start.ctx);
		}
	});
});
