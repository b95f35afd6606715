use skiff_monoio::sdk::Request;
use skiff_monoio::{Config, Error, connect};

/// Watches `camera/video` until its publisher ends it: (group, timestamp, bytes) per frame.
pub async fn watch(url: &str) -> Result<Vec<(u64, u64, usize)>, Error> {
    let (client, runner) = connect(url, Config::default())?;
    monoio::spawn(runner.run());
    let mut track = client.subscribe("camera", "video", Request::LIVE).await?;
    let mut frames = Vec::new();
    while let Some(mut group) = track.next_group().await? {
        while let Some(frame) = group.read_frame().await? {
            frames.push((group.sequence(), frame.timestamp, frame.payload.len()));
        }
    }
    client.close().await;
    Ok(frames)
}
