/**
 * pi's grep always runs a local ripgrep (GrepOperations only checks directories), so the sandboxed
 * grep replaces its execute(): the sandbox's Grep searches inside the jail and the hits are
 * formatted the way pi's grep formats rg's (`path:line: text`, `path-line- text` for context).
 */

import path from "node:path";
import {
	type AgentToolResult,
	DEFAULT_MAX_BYTES,
	formatSize,
	type GrepToolDetails,
	type GrepToolInput,
	truncateHead,
	truncateLine,
} from "@earendil-works/pi-coding-agent";
import { SandboxToolError } from "./errors.ts";
import type { ToolResult } from "./protocol.ts";
import { callSandbox, type SandboxCallContext } from "./operations.ts";

const DEFAULT_LIMIT = 100;
const SERVER_MAX_LIMIT = 1000;
const SERVER_MAX_CONTEXT = 20;

export interface GrepHit {
	path: string;
	line: number;
	isMatch: boolean;
	text: string;
}

/**
 * The hits of a Grep result: `details.hits` ([path, line, is_match, text] tuples) if the server
 * keeps them there, else parsed from its text, one `path:N:text` (match) or `path-N-text`
 * (context) line each. The text form is ambiguous when a file name itself contains `:N:` or
 * `-N-`; parsing starts after `searchPath` to keep that to names below it.
 */
export function parseGrepHits(result: ToolResult, searchPath: string): GrepHit[] {
	const hits = result.details.hits;
	if (Array.isArray(hits)) return hits.flatMap(hitFromDetails);
	const root = searchPath;
	return result.content.split("\n").flatMap((line): GrepHit[] => {
		if (!line.startsWith(root)) return [];
		const rest = /^(.*?)(?::(\d+):|-(\d+)-)(.*)$/s.exec(line.slice(root.length));
		if (!rest) return [];
		const [, tail = "", matchLine, contextLine, text = ""] = rest;
		const number = Number(matchLine ?? contextLine);
		return [{ path: root + tail, line: number, isMatch: matchLine !== undefined, text }];
	});
}

function hitFromDetails(hit: unknown): GrepHit[] {
	if (Array.isArray(hit)) {
		const [p, line, isMatch, text] = hit as unknown[];
		if (typeof p === "string" && typeof line === "number" && typeof text === "string") {
			return [{ path: p, line, isMatch: isMatch === true, text }];
		}
		return [];
	}
	if (typeof hit === "object" && hit !== null) {
		const h = hit as Record<string, unknown>;
		if (typeof h.path === "string" && typeof h.line === "number" && typeof h.text === "string") {
			return [{ path: h.path, line: h.line, isMatch: h.is_match !== false, text: h.text }];
		}
	}
	return [];
}

/** A regular expression (Python `re` and Rust `regex` alike) matching `text` literally. */
export function escapeRegex(text: string): string {
	return text.replace(/[\\^$.|?*+()[\]{}]/g, "\\$&");
}

function resolvePath(cwd: string, input: string | undefined): string {
	const trimmed = (input ?? ".").trim().replace(/^@/, "") || ".";
	const home = process.env.HOME;
	const expanded = home && (trimmed === "~" || trimmed.startsWith("~/")) ? path.join(home, trimmed.slice(1)) : trimmed;
	return path.resolve(cwd, expanded);
}

/**
 * pi's glob filters paths relative to the search root ("src/**\/*.ts", "!*.md"); the sandbox's
 * `include` matches base names only. A plain name pattern is passed as `include`; anything else is
 * matched here on the relative paths of the hits.
 */
function splitGlob(glob: string | undefined): { include?: string; filter?: (relative: string) => boolean } {
	if (!glob) return {};
	const cleaned = glob.replace(/^(!?)(?:\.\/)+/, "$1");
	const negated = cleaned.startsWith("!");
	const pattern = negated ? cleaned.slice(1) : cleaned;
	if (!negated && !pattern.includes("/")) return { include: pattern };
	const matches = (relative: string) =>
		pattern.includes("/") ? path.posix.matchesGlob(relative, pattern) : path.posix.matchesGlob(path.posix.basename(relative), pattern);
	return { filter: (relative) => (negated ? !matches(relative) : matches(relative)) };
}

export async function executeSandboxGrep(
	ctx: SandboxCallContext,
	cwd: string,
	params: GrepToolInput,
	signal?: AbortSignal,
): Promise<AgentToolResult<GrepToolDetails | undefined>> {
	if (signal?.aborted) throw new Error("Operation aborted");
	const searchPath = resolvePath(cwd, params.path);
	const limit = Math.max(1, Math.floor(params.limit ?? DEFAULT_LIMIT));
	const context = params.context && params.context > 0 ? Math.min(Math.floor(params.context), SERVER_MAX_CONTEXT) : 0;
	const { include, filter } = splitGlob(params.glob);
	const args: Record<string, unknown> = {
		pattern: params.literal ? escapeRegex(params.pattern) : params.pattern,
		path: searchPath,
		context,
		limit: Math.min(limit, SERVER_MAX_LIMIT),
		ignore_case: params.ignoreCase === true,
	};
	if (include) args.include = include;
	const result = await callSandbox({ ...ctx, signal: signal ?? ctx.signal }, "Grep", args);
	if (!result.ok) {
		if (result.error_code === "ABORTED") throw new Error("Operation aborted");
		throw new SandboxToolError("Grep", result);
	}
	const display = (p: string) => (p === searchPath ? path.basename(p) : path.relative(searchPath, p).split(path.sep).join("/"));
	const hits = parseGrepHits(result, searchPath).filter((hit) => !filter || filter(display(hit.path)));
	const matchCount = hits.filter((hit) => hit.isMatch).length;
	if (matchCount === 0) return { content: [{ type: "text", text: "No matches found" }], details: undefined };

	let linesTruncated = false;
	const lines = hits.map((hit) => {
		const { text, wasTruncated } = truncateLine(hit.text.replace(/\r?\n?$/, ""));
		if (wasTruncated) linesTruncated = true;
		const rel = display(hit.path);
		return hit.isMatch ? `${rel}:${hit.line}: ${text}` : `${rel}-${hit.line}- ${text}`;
	});
	const truncation = truncateHead(lines.join("\n"), { maxLines: Number.MAX_SAFE_INTEGER });
	let output = truncation.content;
	const details: GrepToolDetails = {};
	const notices: string[] = [];
	const limitReached = result.details.truncated === true || matchCount > limit;
	if (limitReached) {
		notices.push(`${limit} matches limit reached. Use limit=${Math.min(limit * 2, SERVER_MAX_LIMIT)} for more, or refine pattern`);
		details.matchLimitReached = limit;
	}
	if (truncation.truncated) {
		notices.push(`${formatSize(DEFAULT_MAX_BYTES)} limit reached`);
		details.truncation = truncation;
	}
	if (linesTruncated) {
		notices.push("Some lines truncated. Use read tool to see full lines");
		details.linesTruncated = true;
	}
	if (notices.length > 0) output += `\n\n[${notices.join(". ")}]`;
	return { content: [{ type: "text", text: output }], details: Object.keys(details).length > 0 ? details : undefined };
}
