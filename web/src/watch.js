// The watch page: lists the relay's broadcasts and plays each with moq-dev's <moq-watch>
// player. Query parameters:
//   name=BROADCAST  play only that broadcast (no listing), e.g. ?name=cam.hang
//   relay=URL       the relay to watch (default: this page's origin, which serves the page)
//   transport=webtransport  never fall back to WebSocket (the players dial WebTransport only)
//   transport=websocket     WebSocket only (WebTransport hidden from the players)
// Each player's caption shows the transport its session runs over and live figures: frames
// decoded per second and the video bitrate (the page's totals), the round-trip time (when the
// browser's WebTransport has getStats(); Chromium 156's has not) and the latency (the player's playout buffer plus half the RTT);
// `window.skiffLive` holds the same figures by broadcast name.
import "@moq/watch/element";

const params = new URLSearchParams(location.search);
const relay = relayUrl(params.get("relay"));
const only = params.get("name");
const list = document.getElementById("broadcasts");
const status = document.getElementById("status");
const webTransportOnly = params.get("transport") === "webtransport";
// The player dials WebTransport whenever the page has it; hiding it leaves WebSocket.
if (params.get("transport") === "websocket") globalThis.WebTransport = undefined;

/** How often the listing asks the relay for its broadcasts again. */
const POLL_MS = 2000;

/** The relay URL the players dial: `relay` when given and valid, else this page's origin. */
function relayUrl(raw) {
	if (raw) {
		try {
			const url = new URL(raw, location.href);
			if (url.protocol === "http:" || url.protocol === "https:") return url;
		} catch {
			// Falls through to the page's origin; the status line names the bad value.
		}
		console.warn(`ignoring relay=${raw}: not an http(s) URL`);
	}
	return new URL("/", location.href);
}

/** Parses `/announced`: skiff-relay answers a JSON array, moq-relay one path per line. */
function parseAnnounced(text) {
	const trimmed = text.trim();
	if (trimmed.startsWith("[")) {
		const paths = JSON.parse(trimmed);
		if (!Array.isArray(paths)) throw new Error("/announced is not a JSON array");
		return paths.filter((p) => typeof p === "string" && p.length > 0);
	}
	return trimmed
		.split("\n")
		.map((p) => p.trim())
		.filter((p) => p.length > 0);
}

/** The players on the page, by broadcast name. */
const players = new Map();

/** Adds a player for `name`: `<moq-watch url name><canvas></canvas></moq-watch>`. */
function addPlayer(name) {
	const figure = document.createElement("figure");
	const caption = document.createElement("figcaption");
	const link = document.createElement("a");
	const direct = new URLSearchParams({ name });
	if (params.has("relay")) direct.set("relay", relay.href);
	link.href = `?${direct}`;
	link.textContent = name;
	const live = document.createElement("span");
	live.className = "live";
	live.textContent = " connecting…";
	caption.append(link, live);
	const watch = document.createElement("moq-watch");
	// Read by the player when it dials, which happens once it has a url and is in the page.
	if (webTransportOnly) watch.connection.websocket = { enabled: false };
	watch.setAttribute("url", relay.href);
	watch.setAttribute("name", name);
	watch.append(document.createElement("canvas"));
	figure.append(caption, watch);
	list.append(figure);
	players.set(name, { figure, watch, live });
}

/** Makes the players match `names`: new broadcasts get one, gone ones lose theirs. */
function showBroadcasts(names) {
	const wanted = new Set(names);
	for (const [name, player] of players) {
		if (!wanted.has(name)) {
			player.figure.remove();
			players.delete(name);
		}
	}
	for (const name of [...wanted].sort()) {
		if (!players.has(name)) addPlayer(name);
	}
}

// ---------------------------------------------------------------------------
// Live figures
// ---------------------------------------------------------------------------

/** How often the captions' live figures are refreshed, in ms. */
const LIVE_MS = 1000;

/**
 * Frames the page's WebCodecs decoders output and the bytes handed to them. The players make
 * their decoders out of sight, so these are the page's totals: exact with one player (`?name=`),
 * the sum of all with several.
 */
const pageCounts = { frames: 0, bytes: 0 };
if (window.VideoDecoder) {
	const Native = window.VideoDecoder;
	window.VideoDecoder = class extends Native {
		constructor(init) {
			super({
				...init,
				output(frame) {
					pageCounts.frames += 1;
					init.output(frame);
				},
				error: init.error,
			});
		}
		decode(chunk) {
			pageCounts.bytes += chunk.byteLength;
			return super.decode(chunk);
		}
	};
}

/** The live figures of `name`'s player: `window.skiffLive[name]`. */
window.skiffLive = {};
let last = { at: performance.now(), frames: 0, bytes: 0 };

async function refreshLive() {
	const now = performance.now();
	const seconds = Math.max(0.001, (now - last.at) / 1000);
	const fps = (pageCounts.frames - last.frames) / seconds;
	const bitrate = ((pageCounts.bytes - last.bytes) * 8) / seconds;
	last = { at: now, frames: pageCounts.frames, bytes: pageCounts.bytes };
	for (const [name, { watch, live }] of players) {
		const established = watch.connection?.established?.peek?.();
		if (!established) {
			live.textContent = " · connecting…";
			window.skiffLive[name] = { transport: undefined };
			continue;
		}
		const stats = await established.stats?.().catch(() => ({}));
		const rtt = stats?.rtt;
		const buffer = watch.sync?.out?.buffer?.peek?.();
		const figures = {
			transport: String(established.transport),
			version: String(established.version),
			fps,
			bitrate,
			rtt,
			buffer,
		};
		window.skiffLive[name] = figures;
		const parts = [
			`over ${figures.transport === "webtransport" ? "WebTransport" : figures.transport === "websocket" ? "WebSocket" : figures.transport}`,
			`${fps.toFixed(1)} fps`,
			`${(bitrate / 1e6).toFixed(2)} Mb/s`,
		];
		if (typeof rtt === "number") parts.push(`RTT ${rtt.toFixed(1)} ms`);
		if (typeof buffer === "number") parts.push(`latency ${Math.round(buffer + (rtt ?? 0) / 2)} ms`);
		live.textContent = ` · ${parts.join(" · ")}`;
	}
}
setInterval(refreshLive, LIVE_MS);

async function poll() {
	try {
		const response = await fetch(new URL("announced", relay), { cache: "no-store" });
		if (!response.ok) throw new Error(`HTTP ${response.status}`);
		const names = parseAnnounced(await response.text());
		showBroadcasts(names);
		status.textContent =
			names.length === 0
				? `no broadcasts on ${relay.host} yet`
				: `${names.length} broadcast${names.length === 1 ? "" : "s"} on ${relay.host}`;
	} catch (err) {
		status.textContent = `cannot list ${relay.host}'s broadcasts: ${err.message}`;
	}
}

if (only) {
	status.textContent = `${only} on ${relay.host}`;
	showBroadcasts([only]);
} else {
	await poll();
	setInterval(poll, POLL_MS);
}
