use skiff_core::model::track::Info;
use skiff_monoio::{Config, Error, connect};

/// Publishes `frames` frames to `camera/video` at 30 fps, a group per second.
pub async fn publish(url: &str, frames: u64) -> Result<(), Error> {
    let (client, runner) = connect(url, Config::default())?;
    monoio::spawn(runner.run());
    let broadcast = client.publish("camera")?;
    let mut track = broadcast.create_track(Info::new("video").unwrap())?;
    let mut group = track.append_group()?;
    for i in 0..frames {
        if i > 0 && i % 30 == 0 {
            group.finish()?;
            group = track.append_group()?;
        }
        // Timestamps in the track's unit, milliseconds by default.
        group.write_frame(i * 1000 / 30, &[i as u8; 1200]).await?;
        monoio::time::sleep(std::time::Duration::from_millis(33)).await;
    }
    group.finish()?;
    track.finish();
    client.flushed().await;
    client.close().await;
    Ok(())
}
