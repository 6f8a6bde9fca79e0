/**
 * pi's pluggable tool operations, routed to `sandbox serve`.
 *
 *   pi operation                       sandbox tool
 *   BashOperations.exec                Bash {command, timeout}; output streamed from tool.output
 *   ReadOperations.access/readFile     Read {path, raw: true} -> details.data_base64 (one call for both)
 *   EditOperations.access/readFile     Read {path, raw: true}
 *   Write/EditOperations.writeFile     Write {path, content}
 *   WriteOperations.mkdir              nothing: Write creates missing parent directories in the jail
 *   LsOperations.exists/stat/readdir   LS {path} (one call per listed directory)
 *   FindOperations.exists/glob         LS {path} / Glob {pattern, path}
 *   grep (pi always runs a local rg)   Grep, through executeSandboxGrep (see grep.ts)
 *
 * Nothing here touches the host's filesystem or spawns anything: when the server is missing,
 * exited or refuses, the operation throws and pi's tool reports the error.
 */

import { realpathSync } from "node:fs";
import path from "node:path";
import type { BashOperations, EditOperations, FindOperations, LsOperations, ReadOperations, WriteOperations } from "@earendil-works/pi-coding-agent";
import { SandboxError, SandboxProtocolError, SandboxToolError } from "./errors.ts";
import type { OutputStream, ToolResult } from "./protocol.ts";
import type { Approver, CallOptions, SandboxSession } from "./session.ts";

/** What one pi tool execution needs to reach the sandbox. */
export interface SandboxCallContext {
	/** The live session; rejects when there is none (the call then fails: no fallback). */
	session: () => Promise<SandboxSession>;
	/** Answers this execution's approval requests (default: the session's approver). */
	approver?: Approver;
	/** pi's abort signal for the execution (bash brings its own). */
	signal?: AbortSignal;
	/** Prefix of the server-side tool_call_id, e.g. pi's tool call id. */
	idPrefix?: string;
	/** The turn the call belongs to (one per user prompt): the server forgets a denial at the next. */
	turnId?: string;
	/** The user's latest message (for the sandbox's classifier). */
	userMessage?: string;
}

/**
 * `ctx` with `onResult` told of every result its session's calls return (a review record, an
 * approval record), before the caller sees it; everything but `call` is the session's own.
 */
export function observeResults(ctx: SandboxCallContext, onResult: (session: SandboxSession, result: ToolResult) => void): SandboxCallContext {
	return {
		...ctx,
		session: async () => {
			const session = await ctx.session();
			const call: SandboxSession["call"] = async (...args) => {
				const result = await session.call(...args);
				onResult(session, result);
				return result;
			};
			return new Proxy(session, {
				get: (target, key) => {
					if (key === "call") return call;
					const value: unknown = Reflect.get(target, key, target);
					return typeof value === "function" ? value.bind(target) : value;
				},
			});
		},
	};
}

/** A pi-style client deadline: the tool's own timeout plus room for an approval dialog. */
const APPROVAL_ROOM_MS = 3 * 60_000;
const DEFAULT_TOOL_TIMEOUT_S = 300;
const IMAGE_TYPES: Record<string, string> = {
	".png": "image/png",
	".jpg": "image/jpeg",
	".jpeg": "image/jpeg",
	".gif": "image/gif",
	".webp": "image/webp",
	".bmp": "image/bmp",
};

export async function callSandbox(
	ctx: SandboxCallContext,
	tool: string,
	args: Record<string, unknown>,
	extra: Pick<CallOptions, "onOutput" | "signal" | "timeoutMs"> = {},
): Promise<ToolResult> {
	const session = await ctx.session();
	return session.call(tool, args, {
		approver: ctx.approver,
		idPrefix: ctx.idPrefix,
		turnId: ctx.turnId,
		userMessage: ctx.userMessage,
		signal: extra.signal ?? ctx.signal,
		onOutput: extra.onOutput,
		timeoutMs: extra.timeoutMs ?? DEFAULT_TOOL_TIMEOUT_S * 1000 + APPROVAL_ROOM_MS,
	});
}

function expectOk(tool: string, result: ToolResult): ToolResult {
	if (!result.ok) throw new SandboxToolError(tool, result);
	return result;
}

/**
 * pi formats `error.code` instead of the message for some failures (edit's access check); a
 * plain Error keeps the sandbox's explanation visible. The SandboxError stays as the cause.
 */
function plain(error: unknown): Error {
	if (error instanceof SandboxError) return new Error(error.message, { cause: error });
	return error instanceof Error ? error : new Error(String(error));
}

// -- bash ---------------------------------------------------------------------------------------

export interface BashObserver {
	/** Each output chunk as it arrives, stdout and stderr apart (pi's onData merges them). */
	onChunk?: (stream: OutputStream, data: string) => void;
	/** The server's ToolResult (details carry exit_code, stdout, stderr, timed_out, ...). */
	onResult?: (result: ToolResult) => void;
}

function shellQuote(value: string): string {
	return `'${value.replace(/'/g, `'\\''`)}'`;
}

/** The jail's Bash starts in the workspace; another cwd (inside it, normally) is entered first. */
function commandIn(command: string, cwd: string | undefined, workspace: string): string {
	if (!cwd) return command;
	let real = path.resolve(cwd);
	try {
		real = realpathSync(real);
	} catch {
		// A cwd that does not exist on the host: let the jail's cd report it.
	}
	if (real === workspace) return command;
	return `cd -- ${shellQuote(real)} || exit 1\n${command}`;
}

function timedOutAfter(result: ToolResult, requested: number | undefined): string {
	if (requested !== undefined) return String(requested);
	const match = /timed out after ([\d.]+) ?s/.exec(result.content);
	return match?.[1] ?? "?";
}

function exitCodeOf(result: ToolResult): number | null | undefined {
	const { exit_code: code, signal } = result.details;
	if (typeof signal === "number" && signal > 0 && (typeof code !== "number" || code < 0)) return 128 + signal;
	if (typeof code === "number") return code;
	return undefined;
}

export function createSandboxBashOperations(ctx: SandboxCallContext, observer: BashObserver = {}): BashOperations {
	return {
		// pi's env (the host's environment plus PI_* variables) is deliberately not forwarded:
		// the jail gets the profile's scrubbed environment.
		exec: async (command, cwd, { onData, signal, timeout }) => {
			if (signal?.aborted) throw new Error("aborted");
			const session = await ctx.session();
			const streamed = { stdout: false, stderr: false };
			const args: Record<string, unknown> = { command: commandIn(command, cwd, session.info.workspace) };
			if (timeout !== undefined) args.timeout = timeout;
			let result: ToolResult;
			try {
				result = await callSandbox({ ...ctx, session: async () => session }, "Bash", args, {
					signal,
					timeoutMs: (timeout ?? DEFAULT_TOOL_TIMEOUT_S) * 1000 + APPROVAL_ROOM_MS,
					onOutput: (stream, data) => {
						streamed[stream] = true;
						observer.onChunk?.(stream, data);
						onData(Buffer.from(data, "utf8"));
					},
				});
			} catch (error) {
				if (error instanceof SandboxError && error.code === "ABORTED") throw new Error("aborted");
				throw error;
			}
			observer.onResult?.(result);
			// A server that did not stream still returns the captured output.
			for (const stream of ["stdout", "stderr"] as const) {
				const text = result.details[stream];
				if (!streamed[stream] && typeof text === "string" && text) onData(Buffer.from(text, "utf8"));
			}
			// What the proxy refused, one line each (a connection, or a request on a terminated host):
			// the model reads why its command failed, as the server's own text says it.
			for (const line of denialLines(result.details.network)) onData(Buffer.from(`${line}\n`, "utf8"));
			if (result.error_code === "TIMEOUT") throw new Error(`timeout:${timedOutAfter(result, timeout)}`);
			if (result.error_code === "ABORTED" || signal?.aborted) throw new Error("aborted");
			const exitCode = exitCodeOf(result);
			// No exit code: the command never ran (refused, no shell, no backend).
			if (exitCode === undefined) throw new SandboxToolError("Bash", result);
			return { exitCode };
		},
	};
}

// -- files --------------------------------------------------------------------------------------

async function readRaw(ctx: SandboxCallContext, absolutePath: string): Promise<Buffer> {
	const result = await callSandbox(ctx, "Read", { path: absolutePath, raw: true });
	if (!result.ok && result.error_code === "INVALID_ARGUMENT" && /\braw\b/.test(result.content)) {
		throw new SandboxToolError("Read", {
			...result,
			content: `${result.content}\nThis sandbox server cannot return a file's bytes (Read {raw: true}); pi's read and edit need it.`,
		});
	}
	expectOk("Read", result);
	const data = result.details.data_base64;
	if (typeof data !== "string") throw new SandboxProtocolError("Read {raw: true} returned no details.data_base64");
	return Buffer.from(data, "base64");
}

/**
 * pi calls access(p) and then readFile(p): one Read answers both. access() always reads
 * afresh; readFile() takes what the access before it fetched, once, else reads afresh.
 */
function createRawReader(ctx: SandboxCallContext): Pick<ReadOperations, "access" | "readFile"> {
	const fetched = new Map<string, Promise<Buffer>>();
	return {
		access: async (absolutePath) => {
			const bytes = readRaw(ctx, absolutePath);
			fetched.set(absolutePath, bytes);
			bytes.catch(() => undefined);
			try {
				await bytes;
			} catch (error) {
				fetched.delete(absolutePath);
				throw plain(error);
			}
		},
		readFile: async (absolutePath) => {
			const bytes = fetched.get(absolutePath);
			fetched.delete(absolutePath);
			return bytes ?? readRaw(ctx, absolutePath);
		},
	};
}

export function createSandboxReadOperations(ctx: SandboxCallContext): ReadOperations {
	return {
		...createRawReader(ctx),
		detectImageMimeType: async (absolutePath) => IMAGE_TYPES[path.extname(absolutePath).toLowerCase()] ?? null,
	};
}

async function writeFile(ctx: SandboxCallContext, absolutePath: string, content: string): Promise<void> {
	expectOk("Write", await callSandbox(ctx, "Write", { path: absolutePath, content }));
}

export function createSandboxWriteOperations(ctx: SandboxCallContext): WriteOperations {
	return {
		writeFile: (absolutePath, content) => writeFile(ctx, absolutePath, content),
		// The sandbox's Write creates missing parents inside the jail; creating them here would
		// be a write outside the boundary and a second approval for one logical write.
		mkdir: async () => {},
	};
}

export function createSandboxEditOperations(ctx: SandboxCallContext): EditOperations {
	return {
		...createRawReader(ctx),
		writeFile: (absolutePath, content) => writeFile(ctx, absolutePath, content),
	};
}

// -- listings -----------------------------------------------------------------------------------

export interface DirEntry {
	name: string;
	isDirectory: boolean;
}

/** Entries of an LS result: `details.entries` ([{name, type}]) if present, else its text. */
export function parseListing(result: ToolResult): DirEntry[] {
	const entries = result.details.entries;
	if (Array.isArray(entries)) {
		return entries.flatMap((entry): DirEntry[] => {
			if (typeof entry === "string") return [parseListedName(entry)];
			if (typeof entry !== "object" || entry === null) return [];
			const { name, type } = entry as { name?: unknown; type?: unknown };
			return typeof name === "string" ? [{ name, isDirectory: type === "dir" || type === "directory" }] : [];
		});
	}
	if (result.details.count === 0) return [];
	return result.content
		.split("\n")
		.filter((line) => line && !line.startsWith("[") && line !== "(empty directory)")
		.map(parseListedName);
}

function parseListedName(line: string): DirEntry {
	if (line.endsWith("/")) return { name: line.slice(0, -1), isDirectory: true };
	// "@" marks a symlink; pi shows it like a file.
	if (line.endsWith("@")) return { name: line.slice(0, -1), isDirectory: false };
	return { name: line, isDirectory: false };
}

const NOT_A_DIRECTORY = /not a directory/i;

/**
 * pi's ls calls exists(dir), stat(dir), readdir(dir), then stat(dir/entry) for each entry: one
 * LS answers all of them. exists() lists afresh; the others use that listing.
 */
export function createSandboxLsOperations(ctx: SandboxCallContext): LsOperations {
	const listings = new Map<string, DirEntry[] | "file">();
	const list = async (dir: string): Promise<DirEntry[] | "file" | undefined> => {
		const result = await callSandbox(ctx, "LS", { path: dir });
		if (result.ok) return parseListing(result);
		if (result.error_code === "INVALID_ARGUMENT" && NOT_A_DIRECTORY.test(result.content)) return "file";
		if (result.error_code === "TOOL_FAILED" && /does not exist|no such file/i.test(result.content)) return undefined;
		throw new SandboxToolError("LS", result);
	};
	const lookup = async (p: string): Promise<DirEntry[] | "file" | undefined> => {
		const known = listings.get(p);
		if (known) return known;
		const parent = listings.get(path.dirname(p));
		if (Array.isArray(parent)) {
			const entry = parent.find((e) => e.name === path.basename(p));
			if (entry) return entry.isDirectory ? [] : "file";
		}
		const listing = await list(p);
		if (listing !== undefined) listings.set(p, listing);
		return listing;
	};
	return {
		exists: async (p) => {
			listings.clear();
			return (await lookup(p)) !== undefined;
		},
		stat: async (p) => {
			const found = await lookup(p);
			if (found === undefined) throw new Error(`Path not found: ${p}`);
			return { isDirectory: () => found !== "file" };
		},
		readdir: async (p) => {
			// Only a listing made by LS itself names the entries (lookup() may answer from the parent's).
			const found = listings.get(p) ?? (await list(p));
			if (found === undefined) throw new Error(`Path not found: ${p}`);
			if (found === "file") throw new Error(`Not a directory: ${p}`);
			listings.set(p, found);
			return found.map((e) => e.name);
		},
	};
}

/**
 * Paths of a Glob result: `details.paths` if the server keeps them there, else the absolute
 * paths listed in its text (which ends with a "[...]" notice when truncated, or says "no files match").
 */
export function parseGlobPaths(result: ToolResult): string[] {
	const paths = result.details.paths;
	if (Array.isArray(paths)) return paths.filter((p): p is string => typeof p === "string");
	return result.content.split("\n").filter((line) => path.isAbsolute(line));
}

/** pi's find: a pattern without "/" matches file names at any depth (as fd does). */
export function toSandboxGlob(pattern: string): string {
	const cleaned = pattern.replace(/^(?:\.\/)+/, "");
	return cleaned.includes("/") ? cleaned : `**/${cleaned}`;
}

export function createSandboxFindOperations(ctx: SandboxCallContext): FindOperations {
	return {
		exists: async (p) => {
			const result = await callSandbox(ctx, "LS", { path: p });
			if (result.ok) return true;
			if (result.error_code === "INVALID_ARGUMENT" && NOT_A_DIRECTORY.test(result.content)) return true;
			if (result.error_code === "TOOL_FAILED" && /does not exist|no such file/i.test(result.content)) return false;
			throw new SandboxToolError("LS", result);
		},
		glob: async (pattern, cwd, { ignore, limit }) => {
			const result = expectOk("Glob", await callSandbox(ctx, "Glob", { pattern: toSandboxGlob(pattern), path: cwd }));
			const ignored = ignore.map((glob) => glob.replace(/^\*\*\//, "").replace(/\/\*\*$/, ""));
			return parseGlobPaths(result)
				.filter((p) => !ignored.some((segment) => p.split("/").includes(segment)))
				.slice(0, limit);
		},
	};
}

/** The `line` of each denial in a Bash result's `network` (none when it had no allowlist). */
export function denialLines(network: unknown): string[] {
	const denials = (network as { denials?: unknown } | null | undefined)?.denials;
	if (!Array.isArray(denials)) return [];
	return denials.flatMap((denial) => (typeof denial?.line === "string" ? [denial.line as string] : []));
}
