/**
 * Session snapshots in pi (issue 39), against a real `sandbox serve` (bubblewrap, an overlay
 * mount): `/sandbox snapshot` names the id and its counts, `/sandbox restore ID` brings the
 * session's view back (a CONFLICT where the host changed a path since, `--force` restoring all the
 * same; a confirm in pi's UI in `ask`), and `/sandbox fork N` names the new sessions and the
 * snapshot `/sandbox restore` returns to.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { describe, it } from "node:test";
import { approvalTitle } from "../src/index.ts";
import { parseApprovalRequest } from "../src/protocol.ts";
import { SANDBOX_BIN, tempDir, text } from "./helpers.ts";
import { answering, answeringInTurn, loadExtension, type RegisteredTool, sessionDirs } from "./support.ts";

const OVERLAY = { "sandbox-bin": SANDBOX_BIN, "sandbox-mode": "auto", "sandbox-backend": "bwrap", "sandbox-mount": "overlay" };

/** The id a `/sandbox snapshot` or `/sandbox fork` notice names. */
function snapshotId(note: string | undefined): string {
	const id = /snapshot (snap-[0-9a-f]+)/.exec(note ?? "")?.[1];
	assert.ok(id, note);
	return id;
}

/** What the jail's bash prints. */
async function shell(bash: RegisteredTool, command: string, ctx: unknown): Promise<string> {
	return text(await bash.execute(`sh-${command.length}`, { command }, undefined, undefined, ctx)).trim();
}

describe("/sandbox snapshot, restore and fork", () => {
	const dirs = sessionDirs("snap");

	it("/sandbox snapshot names the id and its counts; /sandbox restore brings the view back", async () => {
		const { tools, commands, emit } = loadExtension(OVERLAY);
		const { ctx, notes } = answering(dirs.workspace);
		await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
		try {
			const [write, bash] = [tools.get("write"), tools.get("bash")];
			assert.ok(write && bash);
			await write.execute("w1", { path: "kept.txt", content: "one\n" }, undefined, undefined, ctx);
			await commands.get("sandbox")?.handler("snapshot", ctx);
			assert.match(notes.at(-1) ?? "", /^Sandbox: snapshot snap-[0-9a-f]+ \(1 path changed and 0 paths deleted against the workspace, \d+ bytes\); \/sandbox restore snap-/);
			const id = snapshotId(notes.at(-1));

			await write.execute("w2", { path: "kept.txt", content: "two\n" }, undefined, undefined, ctx);
			await write.execute("w3", { path: "later.txt", content: "later\n" }, undefined, undefined, ctx);
			await commands.get("sandbox")?.handler(`restore ${id}`, ctx);
			assert.match(notes.at(-1) ?? "", new RegExp(`^Sandbox: restored snapshot ${id} in \\d+ ms: .*1 path apart from the workspace.*permission mode auto`));
			assert.equal(await shell(bash, "cat kept.txt; test -e later.txt || echo gone", ctx), "one\ngone");
			// The overlay kept it all from the host's workspace.
			assert.equal(existsSync(path.join(dirs.workspace, "kept.txt")), false);

			await commands.get("sandbox")?.handler("restore", ctx);
			assert.match(notes.at(-1) ?? "", /takes one snapshot id/);
			await commands.get("sandbox")?.handler("restore snap-0000000000000000", ctx);
			assert.match(notes.at(-1) ?? "", /^Sandbox: cannot restore snap-0000000000000000: /);
		} finally {
			await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, ctx);
		}
	});

	it("a path the host changed since is a CONFLICT naming it; --force restores all the same", async () => {
		const { tools, commands, emit } = loadExtension(OVERLAY);
		const { ctx, notes } = answering(dirs.workspace);
		await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
		try {
			const [write, bash] = [tools.get("write"), tools.get("bash")];
			assert.ok(write && bash);
			await write.execute("c1", { path: "shared.txt", content: "jail\n" }, undefined, undefined, ctx);
			await commands.get("sandbox")?.handler("snapshot", ctx);
			const id = snapshotId(notes.at(-1));
			writeFileSync(path.join(dirs.workspace, "shared.txt"), "host\n");
			await commands.get("sandbox")?.handler(`restore ${id}`, ctx);
			const conflict = notes.at(-1) ?? "";
			assert.match(conflict, new RegExp(`^Sandbox: snapshot ${id} was not restored: the host changed shared\\.txt since`));
			assert.match(conflict, new RegExp(`/sandbox restore ${id} --force restores it all the same`));
			await commands.get("sandbox")?.handler(`restore --force ${id}`, ctx);
			assert.match(notes.at(-1) ?? "", new RegExp(`^Sandbox: restored snapshot ${id} .*\\nThe host changed shared\\.txt since; an apply`, "s"));
			assert.equal(await shell(bash, "cat shared.txt", ctx), "jail");
		} finally {
			await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, ctx);
			rmSync(path.join(dirs.workspace, "shared.txt"), { force: true });
		}
	});

	it("in ask, pi's UI confirms the restore: Deny keeps the view, Allow once restores (with the snapshot's modes)", async () => {
		const { tools, commands, emit } = loadExtension(OVERLAY);
		const { ctx, notes, asked } = answeringInTurn(dirs.workspace, ["Deny", "Allow once"]);
		await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
		try {
			const [write, bash] = [tools.get("write"), tools.get("bash")];
			assert.ok(write && bash);
			await write.execute("a1", { path: "asked.txt", content: "before\n" }, undefined, undefined, ctx);
			await commands.get("sandbox")?.handler("snapshot", ctx);
			const id = snapshotId(notes.at(-1));
			await write.execute("a2", { path: "asked.txt", content: "after\n" }, undefined, undefined, ctx);
			await commands.get("sandbox")?.handler("mode ask", ctx);
			assert.equal(asked.length, 0);

			await commands.get("sandbox")?.handler(`restore ${id}`, ctx);
			assert.equal(asked.length, 1, notes.join("\n"));
			assert.match(asked[0] ?? "", new RegExp(`^Sandbox: restore the session's view of the workspace \\(.* <- ${id}\\)\\?\\nrestoring snapshot ${id} discards`));
			assert.match(notes.at(-1) ?? "", new RegExp(`^Sandbox: snapshot ${id} was not restored: sandbox session.restore: the user denied permission`));
			assert.equal(await shell(bash, "cat asked.txt", ctx), "after");

			await commands.get("sandbox")?.handler(`restore ${id}`, ctx);
			assert.equal(asked.length, 2);
			// The snapshot was taken in auto: its mode came back with it.
			assert.match(notes.at(-1) ?? "", new RegExp(`^Sandbox: restored snapshot ${id} .*permission mode auto, operating mode agent$`));
			assert.equal(await shell(bash, "cat asked.txt", ctx), "before");
		} finally {
			await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, ctx);
		}
	});

	it("/sandbox fork N names the new sessions and the snapshot /sandbox restore returns to", async () => {
		const workspace = tempDir("pi-sbx-snap-fork-");
		const { tools, commands, emit } = loadExtension(OVERLAY);
		const { ctx, notes } = answering(workspace);
		await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
		try {
			const [write, bash] = [tools.get("write"), tools.get("bash")];
			assert.ok(write && bash);
			await write.execute("f1", { path: "base.txt", content: "base\n" }, undefined, undefined, ctx);
			for (const bad of ["fork 0", "fork 17", "fork two", "fork 1 2"]) {
				await commands.get("sandbox")?.handler(bad, ctx);
				assert.match(notes.at(-1) ?? "", /takes a number of sessions, 1 to 16/, bad);
			}
			await commands.get("sandbox")?.handler("fork 2", ctx);
			const told = notes.at(-1) ?? "";
			const head = /^Sandbox: forked session (\S+) into 2 sessions from snapshot (snap-[0-9a-f]+): (\S+), (\S+)$/m.exec(told);
			assert.ok(head, told);
			const [, parent, id, first, second] = head;
			assert.equal(new Set([parent, first, second]).size, 3, told);
			assert.match(told, /pi drives one sandbox session and cannot switch to them/);
			assert.match(told, new RegExp(`/sandbox restore ${id} returns it to this point later`));

			// This session goes on; the fork's snapshot brings it back.
			await write.execute("f2", { path: "base.txt", content: "moved on\n" }, undefined, undefined, ctx);
			await commands.get("sandbox")?.handler(`restore ${id}`, ctx);
			assert.match(notes.at(-1) ?? "", new RegExp(`^Sandbox: restored snapshot ${id} `));
			assert.equal(await shell(bash, "cat base.txt", ctx), "base");
		} finally {
			await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, ctx);
		}
		try {
			// As the notice says: the forks closed with the server, their changes kept like this session's.
			const out = execFileSync(SANDBOX_BIN, ["changes", "list", "--json", "--workspace", workspace], { encoding: "utf8" });
			const kept = (JSON.parse(out) as { changesets: unknown[] }).changesets;
			assert.equal(kept.length, 3, out);
		} finally {
			rmSync(workspace, { recursive: true, force: true });
		}
	});

	it("an rw session has no snapshot: the server's reason is shown", async () => {
		const { commands, emit } = loadExtension({ ...OVERLAY, "sandbox-mount": "rw" });
		const { ctx, notes } = answering(dirs.workspace);
		await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
		try {
			await commands.get("sandbox")?.handler("snapshot", ctx);
			assert.match(notes.at(-1) ?? "", /^Sandbox: no snapshot was taken: .*overlay/);
			await commands.get("sandbox")?.handler("fork 1", ctx);
			assert.match(notes.at(-1) ?? "", /^Sandbox: no fork was made: /);
		} finally {
			await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, ctx);
		}
	});

	it("the restore's approval card names the snapshot and allows once or denies", () => {
		const request = parseApprovalRequest({
			session_id: "s",
			tool_call_id: "restore-0123",
			tool: "session.restore",
			operation: "write",
			resource: "/ws <- snap-1",
			reason: "restoring snapshot snap-1 discards what the session changed since",
			rule_id: "session.restore",
			allow_session: false,
		});
		assert.ok(request);
		assert.equal(
			approvalTitle(request),
			"Sandbox: restore the session's view of the workspace (/ws <- snap-1)?\nrestoring snapshot snap-1 discards what the session changed since",
		);
		assert.equal(request.allow_session, false);
	});
});
