// A browser publisher speaking moq-lite-05: it draws a moving pattern on a canvas, encodes it
// with WebCodecs H.264 and publishes it as a hang broadcast (a `catalog.json` track and a
// `video` track in the legacy container), through the same @moq/net the player runs.
// Query parameters:
//   name=BROADCAST  the broadcast path (default: browser.hang)
//   relay=URL       the relay (default: this page's origin, which serves the page)
//   width, height   the picture size (default: 640x360), even numbers
//   fps             frames per second (default: 30)
//   gop             frames per group; each group starts at a keyframe (default: fps)
//   bitrate         encoder target in bits/s (default: 1000000)
//   transport=webtransport  never fall back to WebSocket
// The page dials WebTransport first and WebSocket after a head start (@moq/net's race);
// `window.skiffPublish.transport` and the status line say which one carries the session.
import { Container, Net } from "@moq/hang";

const params = new URLSearchParams(location.search);
const status = document.getElementById("status");
const caption = document.getElementById("caption");
const canvas = document.getElementById("source");

/** The H.264 profile the encoder is asked for: Constrained Baseline, level 3.1. */
const CODEC = "avc1.42e01f";
/** Priorities as moq-dev's hang publisher sets them (catalog above video). */
const CATALOG_PRIORITY = 100;
const VIDEO_PRIORITY = 60;
/** How long a closed video group stays servable to a late subscriber, in ms. */
const VIDEO_MAX_AGE_MS = 30_000;
/** Pause before dialing the relay again after the session ends. */
const RECONNECT_MS = 1000;
/** Frames the encoder may hold before the page drops new ones instead of queueing. */
const MAX_QUEUE = 8;

/** What the page reports for a test or a curious person: `window.skiffPublish`. */
const state = {
	status: "starting",
	connected: false,
	version: undefined,
	transport: undefined,
	framesEncoded: 0,
	framesDropped: 0,
	keyframes: 0,
	bytes: 0,
	error: undefined,
};
window.skiffPublish = state;

function fail(message) {
	state.status = "failed";
	state.error = message;
	status.textContent = `error: ${message}`;
	throw new Error(message);
}

/** An integer query parameter within [min, max], or `fallback` when absent. */
function intParam(key, fallback, min, max) {
	const raw = params.get(key);
	if (raw === null) return fallback;
	const value = Number(raw);
	if (!Number.isInteger(value) || value < min || value > max) {
		fail(`${key}=${raw}: expected an integer in ${min}..${max}`);
	}
	return value;
}

const name = params.get("name") || "browser.hang";
const relay = new URL(params.get("relay") || "/", location.href);
const width = intParam("width", 640, 16, 1920);
const height = intParam("height", 360, 16, 1080);
const fps = intParam("fps", 30, 1, 60);
const gop = intParam("gop", fps, 1, 600);
const bitrate = intParam("bitrate", 1_000_000, 10_000, 20_000_000);
if (width % 2 || height % 2) fail("width and height must be even (4:2:0 video)");
if (relay.protocol !== "http:" && relay.protocol !== "https:") fail(`relay=${relay}: not an http(s) URL`);
if (typeof VideoEncoder === "undefined") {
	fail("this browser has no WebCodecs VideoEncoder (it needs a secure context: https or localhost)");
}

canvas.width = width;
canvas.height = height;
const watch = document.getElementById("watch");
const watchParams = new URLSearchParams({ name });
if (params.has("relay")) watchParams.set("relay", relay.href);
watch.href = `./?${watchParams}`;

// ---------------------------------------------------------------------------
// The broadcast: tracks live in the page, whichever session currently carries them.
// ---------------------------------------------------------------------------

const broadcast = new Net.Broadcast.Producer();
const catalogTrack = broadcast.createTrack("catalog.json", { priority: CATALOG_PRIORITY });
const videoTrack = broadcast.createTrack("video", {
	priority: VIDEO_PRIORITY,
	timescale: Net.Time.Timescale.MICRO,
	latencyMax: VIDEO_MAX_AGE_MS,
});
// A group per GOP: the producer opens a new group at each keyframe. Each frame's payload is
// the QUIC varint of its timestamp in microseconds, then the codec bytes.
const video = new Container.Legacy.Producer(videoTrack);
/** The catalog's one group, kept open so a viewer who joins later still finds it. */
let catalogGroup;

function hex(bytes) {
	return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Writes the catalog once the encoder has said what it produces (codec string and avcC). */
function publishCatalog(config) {
	if (catalogGroup) return;
	const description = config.description ? hex(new Uint8Array(config.description)) : undefined;
	const rendition = {
		codec: config.codec ?? CODEC,
		container: { kind: "legacy" },
		codedWidth: config.codedWidth ?? width,
		codedHeight: config.codedHeight ?? height,
		framerate: fps,
		bitrate,
		optimizeForLatency: true,
	};
	if (description) rendition.description = description;
	catalogGroup = catalogTrack.appendGroup();
	catalogGroup.writeJson({ video: { renditions: { video: rendition } } });
}

// ---------------------------------------------------------------------------
// The encoder
// ---------------------------------------------------------------------------

const encoder = new VideoEncoder({
	output(chunk, metadata) {
		if (metadata?.decoderConfig) publishCatalog(metadata.decoderConfig);
		const keyframe = chunk.type === "key";
		// The container writes the microsecond timestamp prefix; a keyframe opens the next group.
		video.encode(chunk, chunk.timestamp, keyframe);
		state.framesEncoded += 1;
		state.bytes += chunk.byteLength;
		if (keyframe) state.keyframes += 1;
	},
	error(err) {
		fail(`encoder: ${err.message}`);
	},
});

const encoderConfig = {
	codec: CODEC,
	width,
	height,
	bitrate,
	framerate: fps,
	latencyMode: "realtime",
	avc: { format: "avc" },
};
const support = await VideoEncoder.isConfigSupported(encoderConfig);
if (!support.supported) fail(`this browser cannot encode ${CODEC} at ${width}x${height}`);
encoder.configure(encoderConfig);

// ---------------------------------------------------------------------------
// The picture: colour bars, a box that bounces, a sweeping bar and the frame number.
// ---------------------------------------------------------------------------

const ctx = canvas.getContext("2d");
const BARS = ["#c0c0c0", "#c0c000", "#00c0c0", "#00c000", "#c000c0", "#c00000", "#0000c0"];

function draw(frame) {
	const barWidth = width / BARS.length;
	BARS.forEach((color, i) => {
		ctx.fillStyle = color;
		ctx.fillRect(Math.floor(i * barWidth), 0, Math.ceil(barWidth), height);
	});
	const sweep = (frame * 4) % width;
	ctx.fillStyle = "#202020";
	ctx.fillRect(sweep, 0, Math.max(4, width / 40), height);
	const box = Math.floor(Math.min(width, height) / 4);
	const period = 2 * (width - box);
	const x = Math.abs(((frame * 6) % period) - (width - box));
	const y = Math.floor((height - box) / 2 + Math.sin(frame / 15) * (height - box) * 0.4);
	ctx.fillStyle = "#f8f8f8";
	ctx.fillRect(x, y, box, box);
	ctx.fillStyle = "#101010";
	ctx.font = `${Math.floor(box / 3)}px monospace`;
	ctx.textBaseline = "middle";
	ctx.fillText(String(frame % 1000).padStart(3, "0"), x + box * 0.12, y + box / 2);
}

const start = performance.now();
let frame = 0;

function tick() {
	draw(frame);
	if (encoder.encodeQueueSize > MAX_QUEUE) {
		// The encoder is behind: skip this picture rather than grow the latency.
		state.framesDropped += 1;
	} else {
		const timestamp = Math.round((performance.now() - start) * 1000);
		const picture = new VideoFrame(canvas, { timestamp });
		encoder.encode(picture, { keyFrame: frame % gop === 0 });
		picture.close();
	}
	frame += 1;
	caption.textContent =
		`${name}: ${state.framesEncoded} frames encoded, ${state.keyframes} groups, ` +
		`${(state.bytes / 1e6).toFixed(2)} MB, ${state.framesDropped} dropped`;
}
setInterval(tick, 1000 / fps);

// ---------------------------------------------------------------------------
// The session: dial, publish, and dial again when it ends.
// ---------------------------------------------------------------------------

/** A connect failure in words: the transport race rejects with every transport's error. */
function describeError(err) {
	if (err instanceof AggregateError) return err.errors.map(describeError).join("; ");
	return String(err?.message ?? err);
}

/** `transport=webtransport` turns the WebSocket fallback off. */
const connectOptions = params.get("transport") === "webtransport" ? { websocket: { enabled: false } } : undefined;

async function session() {
	for (;;) {
		try {
			state.status = "connecting";
			status.textContent = `connecting to ${relay.host}…`;
			const connection = await Net.Connection.connect(relay, connectOptions);
			connection.publish(Net.Path.from(name), broadcast);
			state.connected = true;
			state.version = connection.version;
			state.transport = String(connection.transport);
			state.status = "publishing";
			const over = state.transport === "webtransport" ? "WebTransport" : state.transport === "websocket" ? "WebSocket" : state.transport;
			status.textContent = `publishing ${name} to ${relay.host} over ${over} (${connection.version})`;
			await connection.closed;
			status.textContent = `session to ${relay.host} ended; dialing again`;
		} catch (err) {
			state.error = describeError(err);
			status.textContent = `cannot reach ${relay.host}: ${state.error}; dialing again`;
		}
		state.connected = false;
		await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS));
	}
}
session();
