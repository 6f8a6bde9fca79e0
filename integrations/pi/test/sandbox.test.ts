/**
 * pi's own tools (createBashTool, createWriteTool, ...) built with the extension's operations,
 * run against a real `sandbox serve` on a temporary workspace.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import {
	type AgentToolResult,
	createBashTool,
	createEditTool,
	createFindTool,
	createLsTool,
	createReadTool,
	createWriteTool,
} from "@earendil-works/pi-coding-agent";
import { executeSandboxGrep } from "../src/grep.ts";
import * as operations from "../src/operations.ts";
import type { OutputStream, ToolResult } from "../src/protocol.ts";
import { openSandbox, pgrep, type Sandbox, serverHasRawRead, tempDir, text, waitFor } from "./helpers.ts";

const RAW_READ = serverHasRawRead() ? false : "the server's Read has no `raw` argument yet (pi's read and edit need the file's bytes)";

/** A failed tool call: pi's tools either throw or return `isError: true` (bash on a non-zero exit). */
async function failure(promise: Promise<AgentToolResult<unknown> & { isError?: boolean }>): Promise<Error> {
	return promise.then(
		(result) => {
			if (result.isError === true) return new Error(text(result));
			return assert.fail(`expected the call to fail, it returned ${JSON.stringify(result).slice(0, 300)}`);
		},
		(error: unknown) => (error instanceof Error ? error : new Error(String(error))),
	);
}

/** pi's own file tools on the sandbox's workspace, each built with the extension's operations. */
function fileTools(sb: Sandbox) {
	const ctx = sb.ctx();
	return {
		write: createWriteTool(sb.workspace, { operations: operations.createSandboxWriteOperations(ctx) }),
		read: createReadTool(sb.workspace, { operations: operations.createSandboxReadOperations(ctx) }),
		edit: createEditTool(sb.workspace, { operations: operations.createSandboxEditOperations(ctx) }),
		ls: createLsTool(sb.workspace, { operations: operations.createSandboxLsOperations(ctx) }),
		find: createFindTool(sb.workspace, { operations: operations.createSandboxFindOperations(ctx) }),
	};
}

function bash(sb: Sandbox) {
	const chunks: Array<[OutputStream, string]> = [];
	const results: ToolResult[] = [];
	const tool = createBashTool(sb.workspace, {
		operations: operations.createSandboxBashOperations(sb.ctx(), {
			onChunk: (stream, data) => chunks.push([stream, data]),
			onResult: (result) => results.push(result),
		}),
	});
	return { tool, chunks, results };
}

describe("pi tools over sandbox serve", () => {
	let sb: Sandbox;
	let outside: string;
	before(async () => {
		sb = await openSandbox({ mode: "auto" });
		outside = tempDir("pi-sbx-outside-");
	});
	after(async () => {
		await sb?.close();
		rmSync(outside, { recursive: true, force: true });
	});

	describe("write confinement", () => {
		it("writes inside the workspace, creating parent directories", async () => {
			const { write } = fileTools(sb);
			const result = await write.execute("w1", { path: "sub/dir/hello.txt", content: "hello\n" });
			assert.match(text(result), /Successfully wrote/);
			assert.equal(readFileSync(path.join(sb.workspace, "sub/dir/hello.txt"), "utf8"), "hello\n");
		});

		it("a write to another directory fails and the host file is not created", async () => {
			const target = path.join(outside, "escape.txt");
			const { write } = fileTools(sb);
			const error = await failure(write.execute("w2", { path: target, content: "pwned" }));
			assert.match(error.message, /sandbox Write/);
			assert.equal(existsSync(target), false);
		});

		it("a write through ../ fails and the host file is not created", async () => {
			const target = path.join(outside, "dotdot.txt");
			const relative = path.relative(sb.workspace, target);
			assert.ok(relative.startsWith("../"), relative);
			const { write } = fileTools(sb);
			await failure(write.execute("w3", { path: relative, content: "pwned" }));
			assert.equal(existsSync(target), false);
		});

		it("bash cannot write outside the workspace either", async () => {
			const target = path.join(outside, "bash-escape.txt");
			const { tool } = bash(sb);
			// The path is hidden from the policy (which asks about a redirect outside the workspace, and
			// no one can be asked here): what is tested is the jail's view, which has no such directory.
			const command = `python3 -c "open('${target}', 'w').write('pwned')"`;
			const result = await failure(tool.execute("b0", { command }));
			assert.match(result.message, /Command exited with code [1-9]/);
			assert.equal(existsSync(target), false);
		});

		it("a write to the host's /tmp lands in the jail's private /tmp, never on the host", async () => {
			const target = `/tmp/pi-sbx-probe-${process.pid}-${Date.now()}.txt`;
			const { write } = fileTools(sb);
			await write.execute("w4", { path: target, content: "pwned" }).catch(() => undefined);
			assert.equal(existsSync(target), false);
		});
	});

	describe("bash in the jail", () => {
		it("runs as a non-root user with the jail's HOME, in the workspace", async () => {
			const { tool } = bash(sb);
			const result = await tool.execute("b1", { command: 'id -u; echo "$HOME"; pwd' });
			const [uid, home, cwd] = text(result).trim().split("\n");
			assert.notEqual(uid, "0");
			assert.notEqual(uid, String(process.getuid?.()));
			assert.notEqual(home, process.env.HOME);
			assert.equal(cwd, sb.workspace);
		});

		it("cannot read /etc/shadow or list /root", async () => {
			const { tool } = bash(sb);
			assert.match((await failure(tool.execute("b2", { command: "cat /etc/shadow" }))).message, /Command exited with code [1-9]/);
			assert.match((await failure(tool.execute("b3", { command: "ls /root" }))).message, /Command exited with code [1-9]/);
		});

		it("keeps stdout and stderr apart", async () => {
			const { tool, chunks, results } = bash(sb);
			const result = await tool.execute("b4", { command: "echo out; echo err >&2; echo out2" });
			assert.match(text(result), /out/);
			const joined = (stream: OutputStream) => chunks.filter(([s]) => s === stream).map(([, d]) => d).join("");
			assert.equal(joined("stdout"), "out\nout2\n");
			assert.equal(joined("stderr"), "err\n");
			assert.equal(results[0]?.details.stdout, "out\nout2\n");
			assert.equal(results[0]?.details.stderr, "err\n");
		});

		it("streams output to pi's onUpdate before the command ends", async () => {
			const { tool } = bash(sb);
			const updates: string[] = [];
			let sawFirstEarly = false;
			const started = Date.now();
			await tool.execute("b5", { command: "echo first; sleep 1.5; echo second" }, undefined, (partial) => {
				const t = text(partial as AgentToolResult<unknown>);
				updates.push(t);
				if (t.includes("first") && !t.includes("second") && Date.now() - started < 1400) sawFirstEarly = true;
			});
			assert.ok(sawFirstEarly, `updates: ${JSON.stringify(updates)}`);
		});

		it("a non-zero exit is pi's error result with the code", async () => {
			const { tool } = bash(sb);
			const error = await failure(tool.execute("b6", { command: "exit 7" }));
			assert.doesNotMatch(error.message, /sandbox/);
			assert.match(error.message, /Command exited with code 7/);
		});

		it("runs in pi's cwd when it is a subdirectory of the workspace", async () => {
			mkdirSync(path.join(sb.workspace, "nested"), { recursive: true });
			const tool = createBashTool(path.join(sb.workspace, "nested"), { operations: operations.createSandboxBashOperations(sb.ctx()) });
			const result = await tool.execute("b7", { command: "pwd" });
			assert.equal(text(result).trim(), path.join(sb.workspace, "nested"));
		});
	});

	describe("timeouts and aborts kill the whole tree", () => {
		const spawnTree = (marker: string) =>
			[
				`setsid bash -c 'sleep 300; : ${marker}-a' &`,
				`setsid sh -c 'trap "" TERM; sleep 300; : ${marker}-b' &`,
				`bash -c 'sleep 300; : ${marker}-c'`,
			].join("\n");

		it("pi's timeout kills setsid'd and TERM-ignoring children", async () => {
			const marker = `pisbx-timeout-${process.pid}-${Date.now()}`;
			const { tool } = bash(sb);
			const call = failure(tool.execute("t1", { command: spawnTree(marker), timeout: 3 }));
			assert.ok(await waitFor(() => pgrep(marker).length >= 3, 2500), "the tree started");
			const error = await call;
			assert.match(error.message, /timed out after 3 seconds/);
			assert.deepEqual(pgrep(marker), [], "no process of the call survives it");
		});

		it("pi's AbortSignal cancels the call (tool.cancel) and kills the tree", async () => {
			const marker = `pisbx-abort-${process.pid}-${Date.now()}`;
			const { tool } = bash(sb);
			const controller = new AbortController();
			const call = failure(tool.execute("t2", { command: spawnTree(marker) }, controller.signal));
			assert.ok(await waitFor(() => pgrep(marker).length >= 3, 2500), "the tree started");
			const abortedAt = Date.now();
			controller.abort();
			const error = await call;
			assert.match(error.message, /aborted/i);
			assert.ok(Date.now() - abortedAt < 5000, "the abort is prompt");
			assert.deepEqual(pgrep(marker), []);
		});
	});

	describe("listing and searching", () => {
		before(() => {
			mkdirSync(path.join(sb.workspace, "src/lib"), { recursive: true });
			writeFileSync(path.join(sb.workspace, "src/main.ts"), "export const answer = 42;\nconsole.log(answer);\n");
			writeFileSync(path.join(sb.workspace, "src/lib/util.ts"), "export function twice(x: number) {\n  return x * 2; // answer\n}\n");
			writeFileSync(path.join(sb.workspace, "README.md"), "# demo\nThe answer is here.\n");
		});

		it("ls lists a directory, directories with a slash", async () => {
			const { ls } = fileTools(sb);
			const listing = text(await ls.execute("l1", { path: "src" })).split("\n");
			assert.deepEqual(listing, ["lib/", "main.ts"]);
		});

		it("ls of a file says it is not a directory", async () => {
			const { ls } = fileTools(sb);
			const error = await failure(ls.execute("l2", { path: "README.md" }));
			assert.match(error.message, /Not a directory/);
		});

		it("find matches names at any depth and paths with a slash", async () => {
			const { find } = fileTools(sb);
			const all = text(await find.execute("f1", { pattern: "*.ts" })).split("\n").sort();
			assert.deepEqual(all, ["src/lib/util.ts", "src/main.ts"]);
			const nested = text(await find.execute("f2", { pattern: "src/lib/*.ts" })).split("\n");
			assert.deepEqual(nested, ["src/lib/util.ts"]);
			assert.match(text(await find.execute("f3", { pattern: "*.nothing" })), /No files found/);
		});

		it("grep searches in the jail and formats hits like pi's grep", async () => {
			const out = text(await executeSandboxGrep(sb.ctx(), sb.workspace, { pattern: "answer" }));
			const lines = out.split("\n").sort();
			assert.deepEqual(lines, [
				"README.md:2: The answer is here.",
				"src/lib/util.ts:2:   return x * 2; // answer",
				"src/main.ts:1: export const answer = 42;",
				"src/main.ts:2: console.log(answer);",
			]);
		});

		it("grep: glob, literal, ignoreCase, context, limit", async () => {
			const grep = (params: Parameters<typeof executeSandboxGrep>[2]) => executeSandboxGrep(sb.ctx(), sb.workspace, params).then(text);
			assert.equal(await grep({ pattern: "answer", glob: "*.md" }), "README.md:2: The answer is here.");
			assert.equal(await grep({ pattern: "answer", glob: "src/lib/**" }), "src/lib/util.ts:2:   return x * 2; // answer");
			assert.equal(await grep({ pattern: "x * 2", literal: true }), "src/lib/util.ts:2:   return x * 2; // answer");
			assert.equal(await grep({ pattern: "THE ANSWER", ignoreCase: true }), "README.md:2: The answer is here.");
			assert.equal(await grep({ pattern: "42", path: "src/main.ts", context: 1 }), "main.ts:1: export const answer = 42;\nmain.ts-2- console.log(answer);");
			const limited = await grep({ pattern: "answer", limit: 1 });
			assert.match(limited, /1 matches limit reached/);
			assert.equal(await grep({ pattern: "no-such-text" }), "No matches found");
		});

		it("grep outside the workspace sees the jail, not the host", async () => {
			writeFileSync(path.join(outside, "secret.txt"), "host secret\n");
			const out = await executeSandboxGrep(sb.ctx(), sb.workspace, { pattern: "secret", path: outside }).then(text, (e: Error) => e.message);
			assert.doesNotMatch(out, /host secret/);
		});
	});

	describe("read and edit", () => {
		it("read returns the file as pi formats it", { skip: RAW_READ }, async () => {
			writeFileSync(path.join(sb.workspace, "r.txt"), "one\ntwo\nthree\n");
			const { read } = fileTools(sb);
			assert.equal(text(await read.execute("r1", { path: "r.txt" })), "one\ntwo\nthree\n");
			assert.match(text(await read.execute("r2", { path: "r.txt", offset: 2, limit: 1 })), /^two\n/);
		});

		it("read of a missing file fails with the sandbox's reason", { skip: RAW_READ }, async () => {
			const { read } = fileTools(sb);
			const error = await failure(read.execute("r3", { path: "missing.txt" }));
			assert.match(error.message, /does not exist/);
		});

		it("read outside the workspace sees the jail, not the host", { skip: RAW_READ }, async () => {
			writeFileSync(path.join(outside, "secret.txt"), "host secret\n");
			const { read } = fileTools(sb);
			const out = await read.execute("r4", { path: path.join(outside, "secret.txt") }).then(text, (e: Error) => e.message);
			assert.doesNotMatch(out, /host secret/);
		});

		it("edit rewrites the file through the sandbox, keeping CRLF line ends", { skip: RAW_READ }, async () => {
			writeFileSync(path.join(sb.workspace, "e.txt"), "alpha\r\nbeta\r\ngamma\r\n");
			const { edit } = fileTools(sb);
			const result = await edit.execute("e1", { path: "e.txt", edits: [{ oldText: "beta", newText: "BETA" }] });
			assert.match(text(result), /Successfully replaced 1 block/);
			assert.equal(readFileSync(path.join(sb.workspace, "e.txt"), "utf8"), "alpha\r\nBETA\r\ngamma\r\n");
		});

		it("edit outside the workspace fails and leaves the host file alone", { skip: RAW_READ }, async () => {
			const target = path.join(outside, "keep.txt");
			writeFileSync(target, "original\n");
			const { edit } = fileTools(sb);
			await failure(edit.execute("e2", { path: target, edits: [{ oldText: "original", newText: "pwned" }] }));
			assert.equal(readFileSync(target, "utf8"), "original\n");
		});
	});
});
