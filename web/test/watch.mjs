#!/usr/bin/env node
// The browser test: headless Chromium opens the watch page and must decode and paint video
// that travelled through a relay. Scenarios (each starts its own processes on loopback):
//   skiff-camera    the H.264 camera (skiff-examples `camera`) -> skiff-relay -> the player
//   skiff-browser   publish.html in one page -> skiff-relay -> the player in another
//   moq-camera      the H.264 camera -> moq-relay 0.17.10 -> the player
//   moq-browser     publish.html -> moq-relay 0.17.10 -> the player
// and the same four over WebTransport (HTTP/3 on the relay's UDP port, its self-signed
// certificate pinned through `GET /certificate.sha256`, as @moq/watch does given http://):
//   skiff-camera-wt, skiff-browser-wt, moq-camera-wt, moq-browser-wt
// The -wt scenarios open the pages with transport=webtransport, which turns the players' and
// the publisher's WebSocket fallback off, require every page to report a WebTransport session,
// and for skiff-relay require its metrics to count the sessions under `webtransport` and none
// under `ws`: a session that fell back to WebSocket fails the scenario.
// or, with --url URL --name NAME, only the player against a relay that is already running
// (its screenshot is --out/TAG.png, TAG from --tag, default "given"); with --transport
// webtransport the page's WebSocket fallback is off and its session must be WebTransport (and
// with --metrics URL, skiff-relay's, the relay must count a WebTransport session and no
// WebSocket one); with --transport websocket the page hides WebTransport from the player and
// its session must be WebSocket.
//
// Each scenario requires at least MIN_FRAMES frames decoded by the page's WebCodecs
// VideoDecoder within WINDOW_MS of the first one, records the time to the first decoded frame,
// screenshots the player's canvas under --out and checks the picture is neither blank nor
// uniform, and that it changes (the source moves).
//
// Usage: node web/test/watch.mjs [--scenarios a,b,...] [--require a,b,...] [--skiff-relay BIN] [--moq-relay BIN]
//        [--camera BIN] [--chromium BIN] [--out DIR]
//        [--url URL --name NAME [--tag TAG] [--transport webtransport|websocket] [--metrics URL]]
// Binaries default to $SKIFF_RELAY, $MOQ_RELAY, $SKIFF_CAMERA, $CHROMIUM. A scenario whose
// binary is not given is skipped with a line that says so, unless --require names it.
// Prints one line per scenario and a closing "N passed, N failed" line; exits 1 on a failure.

import { spawn } from "node:child_process";
import { createReadStream, createWriteStream, existsSync, mkdirSync, statSync } from "node:fs";
import { createServer, get as httpGet } from "node:http";
import { createServer as createNetServer, connect as netConnect } from "node:net";
import { dirname, extname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import puppeteer from "puppeteer-core";

const here = dirname(fileURLToPath(import.meta.url));
const webDir = resolve(here, "..");
const repoDir = resolve(webDir, "..");
const distDir = join(webDir, "dist");

/** Frames the player must decode within WINDOW_MS of its first decoded frame. */
const MIN_FRAMES = 60;
const WINDOW_MS = 10_000;
/** Bound on the first decoded frame after the page opens (the source may still be starting). */
const FIRST_FRAME_MS = 30_000;
/** Bound on a relay or a static server accepting connections. */
const STARTUP_MS = 20_000;
/** Frame rate the browser publisher is asked for; the camera's default is the same. */
const PUBLISH_FPS = 30;

const BASE_SCENARIOS = ["skiff-camera", "skiff-browser", "moq-camera", "moq-browser"];
const SCENARIOS = [...BASE_SCENARIOS, ...BASE_SCENARIOS.map((s) => `${s}-wt`)];

// ---------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------

const { values: opts } = parseArgs({
	options: {
		scenarios: { type: "string" },
		require: { type: "string" },
		"skiff-relay": { type: "string", default: process.env.SKIFF_RELAY },
		"moq-relay": { type: "string", default: process.env.MOQ_RELAY },
		camera: { type: "string", default: process.env.SKIFF_CAMERA },
		chromium: { type: "string", default: process.env.CHROMIUM || "/usr/bin/chromium" },
		out: { type: "string" },
		url: { type: "string" },
		name: { type: "string" },
		tag: { type: "string", default: "given" },
		transport: { type: "string" },
		metrics: { type: "string" },
		help: { type: "boolean", short: "h" },
	},
});

if (opts.help) {
	const text = await import("node:fs/promises").then((fs) => fs.readFile(fileURLToPath(import.meta.url), "utf8"));
	console.log(
		text
			.split("\n")
			.filter((l) => l.startsWith("//"))
			.map((l) => l.slice(3))
			.join("\n"),
	);
	process.exit(0);
}

function listOption(raw, fallback) {
	if (!raw) return fallback;
	const names = raw
		.split(",")
		.map((s) => s.trim())
		.filter(Boolean);
	for (const n of names) {
		if (!SCENARIOS.includes(n)) usage(`unknown scenario ${n}; known: ${SCENARIOS.join(", ")}`);
	}
	return names;
}

function usage(message) {
	console.error(`watch.mjs: ${message}`);
	process.exit(2);
}

const chosen = listOption(opts.scenarios, SCENARIOS);
const required = new Set(listOption(opts.require, []));
const outDir = resolve(opts.out ?? join(process.env.CARGO_TARGET_DIR || join(repoDir, "target"), "browser"));
if (opts.url && !opts.name) usage("--url needs --name (the broadcast to watch)");
if (opts.transport !== undefined && opts.transport !== "webtransport" && opts.transport !== "websocket") {
	usage(`--transport ${opts.transport}: webtransport or websocket`);
}
if (opts.metrics && opts.transport !== "webtransport") usage("--metrics goes with --transport webtransport");
if ((opts.transport || opts.metrics) && !opts.url) usage("--transport and --metrics go with --url");
for (const [flag, path] of [
	["--skiff-relay", opts["skiff-relay"]],
	["--moq-relay", opts["moq-relay"]],
	["--camera", opts.camera],
]) {
	if (path && !isFile(path)) usage(`${flag} ${path}: no such file`);
}
if (!isFile(opts.chromium)) usage(`no Chromium at ${opts.chromium} (apt-get install chromium, or --chromium BIN)`);
if (!isFile(join(distDir, "index.html"))) usage(`${distDir} is not built: npm --prefix web run build`);

function isFile(path) {
	try {
		return statSync(path).isFile();
	} catch {
		return false;
	}
}

// ---------------------------------------------------------------------------
// Processes, ports and the static server
// ---------------------------------------------------------------------------

/** Everything started here, stopped on the way out (also on a failure). */
const cleanups = [];

async function cleanupAll() {
	while (cleanups.length) {
		const fn = cleanups.pop();
		try {
			await fn();
		} catch (err) {
			console.error(`cleanup: ${err.message}`);
		}
	}
}

/** A free loopback TCP port (bound, read and released). */
function freePort() {
	return new Promise((resolvePort, reject) => {
		const srv = createNetServer();
		srv.once("error", reject);
		srv.listen(0, "127.0.0.1", () => {
			const { port } = srv.address();
			srv.close(() => resolvePort(port));
		});
	});
}

/** Starts `bin args`, its output in `log`; resolves to a handle whose `stop()` ends it. */
function startProcess(label, bin, args, log) {
	const out = createWriteStream(log);
	const child = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] });
	child.stdout.pipe(out);
	child.stderr.pipe(out);
	let exited;
	const exit = new Promise((r) => child.once("exit", (code, signal) => r((exited = { code, signal }))));
	child.once("error", (err) => out.write(`spawn failed: ${err.message}\n`));
	const handle = {
		label,
		log,
		child,
		get exited() {
			return exited;
		},
		async stop() {
			if (!exited) {
				child.kill("SIGTERM");
				const timer = setTimeout(() => child.kill("SIGKILL"), 3000);
				await exit;
				clearTimeout(timer);
			}
			out.end();
		},
	};
	cleanups.push(() => handle.stop());
	return handle;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Waits until `port` accepts a TCP connection, failing early if `proc` exits. */
async function waitListening(port, proc) {
	const deadline = Date.now() + STARTUP_MS;
	for (;;) {
		if (proc?.exited) throw new Error(`${proc.label} exited during startup (${JSON.stringify(proc.exited)}); see ${proc.log}`);
		const ok = await new Promise((r) => {
			const s = netConnect(port, "127.0.0.1");
			s.once("connect", () => {
				s.destroy();
				r(true);
			});
			s.once("error", () => r(false));
		});
		if (ok) return;
		if (Date.now() > deadline) throw new Error(`nothing listens on 127.0.0.1:${port} after ${STARTUP_MS} ms`);
		await sleep(100);
	}
}

/** GETs `url`; resolves to { status, body }. */
function fetchText(url) {
	return new Promise((r, reject) => {
		const req = httpGet(url, { timeout: 5000 }, (res) => {
			let body = "";
			res.setEncoding("utf8");
			res.on("data", (d) => {
				body += d;
			});
			res.on("end", () => r({ status: res.statusCode, body }));
		});
		req.on("timeout", () => req.destroy(new Error(`GET ${url} timed out`)));
		req.on("error", reject);
	});
}

const TYPES = {
	".html": "text/html; charset=utf-8",
	".js": "text/javascript; charset=utf-8",
	".css": "text/css; charset=utf-8",
	".map": "application/json",
};

/** Serves web/dist on a loopback port, for relays that do not serve the page themselves. */
async function startStaticServer() {
	const server = createServer((req, res) => {
		const path = new URL(req.url, "http://x").pathname;
		const file = resolve(distDir, `.${path === "/" ? "/index.html" : decodeURIComponent(path)}`);
		if (!file.startsWith(distDir) || !isFile(file)) {
			res.writeHead(404).end("not found");
			return;
		}
		res.writeHead(200, { "content-type": TYPES[extname(file)] ?? "application/octet-stream" });
		createReadStream(file).pipe(res);
	});
	await new Promise((r) => server.listen(0, "127.0.0.1", r));
	cleanups.push(() => new Promise((r) => server.close(r)));
	return `http://127.0.0.1:${server.address().port}/`;
}

// ---------------------------------------------------------------------------
// Relays and sources
// ---------------------------------------------------------------------------

/**
 * skiff-relay on one port: QMux over TCP and over WebSocket, and the page from web/dist; with
 * `wt`, also HTTP/3 with WebTransport on the same port over UDP with a generated certificate,
 * and its metrics on a second port.
 */
async function startSkiffRelay(tag, wt) {
	const port = await freePort();
	const args = ["serve", "--listen", `127.0.0.1:${port}`];
	let metrics;
	if (wt) {
		const metricsPort = await freePort();
		args.push("--tls-generate", "localhost,127.0.0.1", "--metrics", `127.0.0.1:${metricsPort}`);
		metrics = `http://127.0.0.1:${metricsPort}/metrics`;
	}
	const proc = startProcess("skiff-relay", opts["skiff-relay"], args, join(outDir, `${tag}-skiff-relay.log`));
	await waitListening(port, proc);
	const health = await fetchText(`http://127.0.0.1:${port}/health`);
	if (health.status !== 200) throw new Error(`skiff-relay GET /health answered ${health.status}`);
	const page = `http://127.0.0.1:${port}/`;
	return { proc, tcp: `tcp://127.0.0.1:${port}/`, relay: page, page, metrics };
}

/** skiff-relay's per-transport series, `{ transport: { open, sent, received } }`. */
async function transportMetrics(url) {
	const { status, body } = await fetchText(url);
	if (status !== 200) throw new Error(`GET ${url} answered ${status}`);
	const out = {};
	const names = { connections_open: "open", sent_bytes_total: "sent", received_bytes_total: "received" };
	for (const line of body.split("\n")) {
		const m = /^skiff_relay_transport_(\w+)\{transport="(\w+)"\} (\d+)/.exec(line);
		if (!m || !names[m[1]]) continue;
		out[m[2]] ??= { open: 0, sent: 0, received: 0 };
		out[m[2]][names[m[1]]] = Number(m[3]);
	}
	return out;
}

/**
 * moq-relay 0.17.10: QMux over TCP on one port, WebSocket on another, anonymous access; with
 * `wt`, also QUIC and WebTransport on the WebSocket port's number over UDP with a generated
 * certificate (the player given http://HOST:PORT/ fetches the hash there and dials
 * https://HOST:PORT/).
 */
async function startMoqRelay(tag, wt) {
	const tcpPort = await freePort();
	const webPort = await freePort();
	const args = ["--listen-tcp-bind", `127.0.0.1:${tcpPort}`, "--web-http-listen", `127.0.0.1:${webPort}`, "--auth-public", "**", "--log-level", "info"];
	if (wt) args.push("--listen", `127.0.0.1:${webPort}`, "--listen-tls-generate", "localhost");
	const proc = startProcess("moq-relay", opts["moq-relay"], args, join(outDir, `${tag}-moq-relay.log`));
	await waitListening(tcpPort, proc);
	await waitListening(webPort, proc);
	const page = await startStaticServer();
	return { proc, tcp: `tcp://127.0.0.1:${tcpPort}/`, relay: `http://127.0.0.1:${webPort}/`, page };
}

/** The H.264 camera publishing `name` to the relay's TCP URL. */
function startCamera(tag, relay, name) {
	return startProcess("camera", opts.camera, ["--url", relay.tcp, "--broadcast", name], join(outDir, `${tag}-camera.log`));
}

// ---------------------------------------------------------------------------
// The browser
// ---------------------------------------------------------------------------

const CHROMIUM_ARGS = [
	"--headless=new",
	"--no-sandbox",
	"--use-gl=swiftshader",
	"--enable-unsafe-swiftshader",
	"--disable-dev-shm-usage",
	"--autoplay-policy=no-user-gesture-required",
	// The publisher's page draws and encodes on a timer; keep it at full rate beside the player.
	"--disable-background-timer-throttling",
	"--disable-renderer-backgrounding",
	"--disable-backgrounding-occluded-windows",
	// The machine's network is loopback only: no calls home, no component downloads.
	"--disable-background-networking",
	"--disable-component-update",
	"--disable-sync",
	"--no-first-run",
];

/**
 * Runs in the watch page before its scripts: counts the frames every VideoDecoder outputs
 * (the player's own counter counts frames handed to the decoder, not decoded ones).
 */
function instrumentDecoder() {
	const stats = { decoded: 0, firstAt: undefined, lastAt: undefined, size: undefined, configs: [], errors: [] };
	window.skiffWatch = stats;
	// When the first WebTransport session was dialed and when it was up, for the first frame's
	// breakdown: page load and certificate fetch, then the handshake, then setup to picture.
	const NativeWT = window.WebTransport;
	if (NativeWT) {
		window.WebTransport = class extends NativeWT {
			constructor(...args) {
				super(...args);
				stats.dialedAt ??= performance.now();
				this.ready.then(() => {
					stats.readyAt ??= performance.now();
				}, () => {});
			}
		};
	}
	const Native = window.VideoDecoder;
	if (!Native) return;
	window.VideoDecoder = class extends Native {
		constructor(init) {
			super({
				...init,
				output(frame) {
					const now = performance.now();
					stats.decoded += 1;
					stats.firstAt ??= now;
					stats.size ??= `${frame.displayWidth}x${frame.displayHeight}`;
					stats.lastAt = now;
					init.output(frame);
				},
				error(err) {
					stats.errors.push(String(err?.message ?? err));
					init.error(err);
				},
			});
		}
		configure(config) {
			stats.configs.push(config.codec);
			return super.configure(config);
		}
	};
}

/** Analyses a PNG in the page: luma spread, distinct colours and lit pixels. */
async function pictureStats(page, png) {
	return page.evaluate(async (b64) => {
		const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
		const bitmap = await createImageBitmap(new Blob([bytes], { type: "image/png" }));
		const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
		const ctx = canvas.getContext("2d");
		ctx.drawImage(bitmap, 0, 0);
		const { data } = ctx.getImageData(0, 0, bitmap.width, bitmap.height);
		const colours = new Set();
		let sum = 0;
		let sumSq = 0;
		let lit = 0;
		const n = data.length / 4;
		for (let i = 0; i < data.length; i += 4) {
			const [r, g, b] = [data[i], data[i + 1], data[i + 2]];
			const y = 0.299 * r + 0.587 * g + 0.114 * b;
			sum += y;
			sumSq += y * y;
			if (y > 24) lit += 1;
			colours.add(((r >> 4) << 8) | ((g >> 4) << 4) | (b >> 4));
		}
		const mean = sum / n;
		return {
			width: bitmap.width,
			height: bitmap.height,
			mean,
			stddev: Math.sqrt(Math.max(0, sumSq / n - mean * mean)),
			colours: colours.size,
			lit: lit / n,
		};
	}, png.toString("base64"));
}

/** Share of pixels that differ noticeably between two same-size PNGs. */
async function pictureChange(page, a, b) {
	return page.evaluate(
		async (a64, b64) => {
			async function pixels(b64) {
				const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
				const bitmap = await createImageBitmap(new Blob([bytes], { type: "image/png" }));
				const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
				const ctx = canvas.getContext("2d");
				ctx.drawImage(bitmap, 0, 0);
				return ctx.getImageData(0, 0, bitmap.width, bitmap.height).data;
			}
			const [pa, pb] = [await pixels(a64), await pixels(b64)];
			if (pa.length !== pb.length) return 1;
			let changed = 0;
			for (let i = 0; i < pa.length; i += 4) {
				const d = Math.abs(pa[i] - pb[i]) + Math.abs(pa[i + 1] - pb[i + 1]) + Math.abs(pa[i + 2] - pb[i + 2]);
				if (d > 48) changed += 1;
			}
			return changed / (pa.length / 4);
		},
		a.toString("base64"),
		b.toString("base64"),
	);
}

/** Collects a page's console errors and crashes for the failure message. */
function recordConsole(page, label, sink) {
	page.on("console", (msg) => {
		if (msg.type() === "error" || msg.type() === "warn") sink.push(`[${label} ${msg.type()}] ${msg.text()}`);
	});
	page.on("pageerror", (err) => sink.push(`[${label} pageerror] ${err.message}`));
}

/**
 * Opens the watch page for `name` on `relay` and measures it. Returns the figures; throws with
 * what the page said when a check fails.
 */
async function watch(browser, tag, pageUrl, relayUrl, name, transport = undefined) {
	const context = await browser.createBrowserContext();
	cleanups.push(() => context.close());
	const page = await context.newPage();
	const messages = [];
	recordConsole(page, "watch", messages);
	await page.setViewport({ width: 1280, height: 800 });
	await page.evaluateOnNewDocument(instrumentDecoder);
	const url = new URL(pageUrl);
	url.searchParams.set("name", name);
	if (transport) url.searchParams.set("transport", transport);
	if (new URL(relayUrl).origin !== url.origin) url.searchParams.set("relay", relayUrl);
	const explain = (what) => `${what}\n  page ${url}\n  ${messages.slice(-15).join("\n  ") || "(no console output)"}`;

	await page.goto(url.href, { waitUntil: "load" });
	const first = await page
		.waitForFunction(() => window.skiffWatch?.firstAt !== undefined, { timeout: FIRST_FRAME_MS, polling: 100 })
		.then(() => page.evaluate(() => ({ ...window.skiffWatch })))
		.catch(async () => {
			const s = await page.evaluate(() => window.skiffWatch).catch(() => undefined);
			throw new Error(explain(`no frame decoded within ${FIRST_FRAME_MS} ms (decoder stats ${JSON.stringify(s)})`));
		});
	const session = await page.evaluate(() => {
		const el = document.querySelector("moq-watch");
		const established = el?.connection?.established?.peek?.();
		return established ? { version: established.version, transport: String(established.transport) } : undefined;
	});
	if (transport && session?.transport !== transport) {
		throw new Error(explain(`the player's session runs over ${session?.transport ?? "nothing known"}, not ${transport}`));
	}
	await sleep(WINDOW_MS);
	const after = await page.evaluate(() => ({ ...window.skiffWatch }));
	// The page's own live figures (its caption), as a person sees them.
	const live = await page.evaluate((n) => window.skiffLive?.[n], name);
	const inWindow = after.decoded - first.decoded;

	const canvas = await page.$("moq-watch canvas");
	if (!canvas) throw new Error(explain("the page has no moq-watch canvas"));
	const shotPath = join(outDir, `${tag}.png`);
	const shot = Buffer.from(await canvas.screenshot({ path: shotPath }));
	await sleep(700);
	const later = Buffer.from(await canvas.screenshot());
	const picture = await pictureStats(page, shot);
	const change = await pictureChange(page, shot, later);

	const figures = {
		decodedIn10s: inWindow,
		decodedTotal: after.decoded,
		firstFrameMs: Math.round(first.firstAt),
		dialedMs: after.dialedAt === undefined ? undefined : Math.round(after.dialedAt),
		readyMs: after.readyAt === undefined ? undefined : Math.round(after.readyAt),
		fps: inWindow / (WINDOW_MS / 1000),
		codec: after.configs[0],
		size: after.size,
		session,
		live,
		picture,
		change,
		screenshot: shotPath,
	};
	if (after.errors.length) throw new Error(explain(`decoder errors: ${after.errors.join("; ")}`));
	if (inWindow < MIN_FRAMES) {
		throw new Error(explain(`only ${inWindow} frames decoded in the ${WINDOW_MS} ms after the first (need ${MIN_FRAMES})`));
	}
	if (picture.stddev < 8 || picture.colours < 8 || picture.lit < 0.05) {
		throw new Error(explain(`the screenshot ${shotPath} looks blank or uniform: ${JSON.stringify(picture)}`));
	}
	if (change < 0.001) throw new Error(explain(`the picture did not change over 700 ms (${(change * 100).toFixed(3)} % of pixels)`));
	return figures;
}

/** Opens the watch page without a name: its listing (from `/announced`) must show `name`. */
async function listing(browser, pageUrl, relayUrl, name) {
	const context = await browser.createBrowserContext();
	try {
		const page = await context.newPage();
		const url = new URL(pageUrl);
		if (new URL(relayUrl).origin !== url.origin) url.searchParams.set("relay", relayUrl);
		await page.goto(url.href, { waitUntil: "load" });
		await page.waitForSelector(`moq-watch[name="${name}"] canvas`, { timeout: STARTUP_MS }).catch(async () => {
			const status = await page.$eval("#status", (el) => el.textContent).catch(() => "?");
			throw new Error(`the listing at ${url} did not show ${name} within ${STARTUP_MS} ms (it says: ${status})`);
		});
		return await page.$$eval("moq-watch", (els) => els.map((el) => el.getAttribute("name")));
	} finally {
		await context.close();
	}
}

/** Opens publish.html publishing `name` to `relay`; resolves once it publishes. */
async function publishFromBrowser(browser, pageUrl, relayUrl, name, wt = false) {
	const context = await browser.createBrowserContext();
	cleanups.push(() => context.close());
	const page = await context.newPage();
	const messages = [];
	recordConsole(page, "publish", messages);
	const url = new URL("publish.html", pageUrl);
	url.searchParams.set("name", name);
	url.searchParams.set("fps", String(PUBLISH_FPS));
	if (wt) url.searchParams.set("transport", "webtransport");
	if (new URL(relayUrl).origin !== url.origin) url.searchParams.set("relay", relayUrl);
	await page.goto(url.href, { waitUntil: "load" });
	await page
		.waitForFunction(() => window.skiffPublish?.connected && window.skiffPublish.framesEncoded > 0, { timeout: STARTUP_MS, polling: 100 })
		.catch(async () => {
			const s = await page.evaluate(() => window.skiffPublish).catch(() => undefined);
			throw new Error(`publish.html did not start publishing: ${JSON.stringify(s)}\n  page ${url}\n  ${messages.join("\n  ")}`);
		});
	return page;
}

// ---------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------

/** What a scenario needs, or why it cannot run. */
function missing(scenario) {
	const needs = [];
	if (scenario.startsWith("skiff-") && !opts["skiff-relay"]) needs.push("--skiff-relay / $SKIFF_RELAY");
	if (scenario.startsWith("moq-") && !opts["moq-relay"]) needs.push("--moq-relay / $MOQ_RELAY");
	if (scenario.includes("-camera") && !opts.camera) needs.push("--camera / $SKIFF_CAMERA");
	return needs;
}

/** Waits until the relay's `GET /announced` lists `name` (a JSON array or one path a line). */
async function waitAnnounced(relayUrl, name) {
	const url = new URL("announced", relayUrl).href;
	const deadline = Date.now() + STARTUP_MS;
	for (;;) {
		const { status, body } = await fetchText(url).catch(() => ({ status: 0, body: "" }));
		if (status === 200 && (body.includes(`"${name}"`) || body.split("\n").some((l) => l.trim() === name))) return;
		if (Date.now() > deadline) throw new Error(`${url} did not list ${name} within ${STARTUP_MS} ms (last answer ${status}: ${body.slice(0, 200)})`);
		await sleep(100);
	}
}

async function runScenario(browser, scenario) {
	const wt = scenario.endsWith("-wt");
	const relay = scenario.startsWith("skiff-") ? await startSkiffRelay(scenario, wt) : await startMoqRelay(scenario, wt);
	let name;
	let publisher;
	if (scenario.includes("-camera")) {
		name = "cam.hang";
		startCamera(scenario, relay, name);
	} else {
		name = "browser.hang";
		publisher = await publishFromBrowser(browser, relay.page, relay.relay, name, wt);
	}
	// The first frame is timed from the page opening, with the broadcast already live.
	await waitAnnounced(relay.relay, name);
	const figures = await watch(browser, scenario, relay.page, relay.relay, name, wt ? "webtransport" : undefined);
	figures.sourceFps = PUBLISH_FPS;
	if (publisher) {
		figures.published = await publisher.evaluate(() => ({ ...window.skiffPublish }));
		if (wt && figures.published.transport !== "webtransport") {
			throw new Error(`publish.html's session runs over ${figures.published.transport}, not WebTransport`);
		}
	}
	if (relay.metrics) {
		// Every browser session so far (the player, and the publisher) is WebTransport: the
		// relay counts them open under `webtransport` and never saw a WebSocket byte.
		const m = await transportMetrics(relay.metrics);
		figures.transports = m;
		const sessions = publisher ? 2 : 1;
		if ((m.webtransport?.open ?? 0) < sessions || (m.ws?.open ?? 0) !== 0 || (m.ws?.received ?? 0) !== 0) {
			throw new Error(`skiff-relay's transport metrics do not show ${sessions} WebTransport session(s) and no WebSocket: ${JSON.stringify(m)}`);
		}
	}
	figures.listed = await listing(browser, relay.page, relay.relay, name);
	return figures;
}

function describe(f) {
	const p = f.picture;
	return (
		`${f.decodedIn10s} frames decoded in 10 s after the first (${f.fps.toFixed(1)} fps` +
		(f.sourceFps ? `, ${((f.fps / f.sourceFps) * 100).toFixed(1)} % of the source's ${f.sourceFps}), ` : "), ") +
		`first frame ${f.firstFrameMs} ms after the page opened${f.readyMs === undefined ? "" : ` (WebTransport dialed at ${f.dialedMs} ms, up at ${f.readyMs} ms)`}, ${f.codec} ${f.size}, ` +
		`${f.session ? `${f.session.version} over ${f.session.transport}` : "session unknown"}; ` +
		(f.live ? `the page showed ${JSON.stringify(f.live)}; ` : "") +
		(f.transports ? `relay transports ${JSON.stringify(f.transports)}; ` : "") +
		`picture ${p.width}x${p.height} luma ${p.mean.toFixed(0)}±${p.stddev.toFixed(0)}, ${p.colours} colours, ` +
		`${(f.change * 100).toFixed(1)} % changed in 0.7 s; screenshot ${f.screenshot}`
	);
}

mkdirSync(outDir, { recursive: true });
// Signals stop the relays and sources started here too, not only the browser.
const browser = await puppeteer.launch({
	executablePath: opts.chromium,
	args: CHROMIUM_ARGS,
	headless: true,
	handleSIGINT: false,
	handleSIGTERM: false,
	handleSIGHUP: false,
});
cleanups.push(() => browser.close());
for (const [signal, code] of [
	["SIGINT", 130],
	["SIGTERM", 143],
	["SIGHUP", 129],
]) {
	process.on(signal, () => stopAll(`${signal}: stopping`, code));
}
// A bug in this script must not leave relays or sources running either.
process.on("uncaughtException", (err) => stopAll(`internal error: ${err.stack ?? err}`, 1));
process.on("unhandledRejection", (err) => stopAll(`internal error: ${err?.stack ?? err}`, 1));

let stopping = false;
async function stopAll(message, code) {
	if (stopping) return;
	stopping = true;
	console.log(message);
	await cleanupAll();
	process.exit(code);
}

let passed = 0;
let failed = 0;
let skipped = 0;
try {
	if (opts.url) {
		try {
			const f = await watch(browser, opts.tag, opts.url, opts.url, opts.name, opts.transport);
			if (opts.metrics) {
				const m = await transportMetrics(opts.metrics);
				f.transports = m;
				if ((m.webtransport?.open ?? 0) < 1 || (m.ws?.open ?? 0) !== 0 || (m.ws?.received ?? 0) !== 0) {
					throw new Error(`the relay's transport metrics do not show a WebTransport session and no WebSocket: ${JSON.stringify(m)}`);
				}
			}
			console.log(`ok    ${opts.name} on ${opts.url}: ${describe(f)}`);
			passed += 1;
		} catch (err) {
			console.log(`FAIL  ${opts.name} on ${opts.url}: ${err.message}`);
			failed += 1;
		}
	} else {
		for (const scenario of chosen) {
			const needs = missing(scenario);
			if (needs.length) {
				if (required.has(scenario)) {
					console.log(`FAIL  ${scenario}: required but not given ${needs.join(", ")}`);
					failed += 1;
				} else {
					console.log(`skip  ${scenario}: not given ${needs.join(", ")}`);
					skipped += 1;
				}
				continue;
			}
			const mark = cleanups.length;
			try {
				const f = await runScenario(browser, scenario);
				console.log(`ok    ${scenario}: ${describe(f)}`);
				console.log(`      the listing shows ${f.listed.join(", ")}`);
				if (f.published) {
					const p = f.published;
					console.log(`      publisher: ${p.framesEncoded} frames encoded, ${p.keyframes} groups, ${p.framesDropped} dropped, ${p.version}`);
				}
				passed += 1;
			} catch (err) {
				console.log(`FAIL  ${scenario}: ${err.message}\n      logs in ${outDir}`);
				failed += 1;
			}
			// Stop this scenario's relay, sources and pages before the next one starts.
			while (cleanups.length > mark) {
				try {
					await cleanups.pop()();
				} catch (err) {
					console.error(`cleanup after ${scenario}: ${err.message}`);
				}
			}
		}
	}
} finally {
	await cleanupAll();
}
console.log(`${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ""}`);
process.exit(failed ? 1 : 0);
