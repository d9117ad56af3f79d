//! TensorBoard event files (kiln-sched's reader, which tests and tools point at any log
//! folder): random events encoded and decoded back exactly (the reference is the event itself),
//! then their protobuf bytes mutated and framed as valid records (so the CRCs pass and the
//! decoder sees the damage), or the framed file's bytes mutated (so the CRCs catch it), and
//! the folder read. Every case must end in `Ok` or a typed error.

use crate::harness::{run, Outcome, Rng};
use kiln::sched::log::tfevents::{
    decode_event, encode_event, frame_record, read_log_dir, Event, EventBody,
};

fn random_event(rng: &mut Rng) -> Event {
    let text = |rng: &mut Rng| -> String {
        (0..rng.below(12))
            .map(|_| char::from_u32(rng.below(0x800) as u32).unwrap_or('x'))
            .collect()
    };
    let body = match rng.below(3) {
        0 => EventBody::FileVersion(text(rng)),
        1 => EventBody::SessionStart,
        _ => EventBody::Scalars(
            (0..rng.below(4))
                .map(|_| {
                    let v = rng.pick(&[0.0, -1.5, f32::MAX, f32::INFINITY, 1e-45]);
                    (text(rng), v)
                })
                .collect(),
        ),
    };
    let any = rng.next_u64() as i64;
    Event {
        wall_time: rng.pick(&[0.0, 1.7e9, -1.0, f64::MAX, 1e-300]),
        step: rng.pick(&[0, 1, -1, i64::MAX, i64::MIN, any]),
        body,
    }
}

#[derive(Debug)]
pub struct EventsCase {
    events: Vec<Event>,
    /// Mutations `(which event, byte position, xor mask)` of the protobuf bytes, framed after.
    inner: Vec<(usize, usize, u8)>,
    /// Mutations `(byte position, xor mask)` of the framed file, and where to cut it.
    outer: Vec<(usize, u8)>,
    cut: Option<usize>,
}

pub fn tensorboard_events(seed: u64, cases: usize) {
    let dir = std::env::temp_dir().join(format!("kiln-fuzz-events-{}", std::process::id()));
    let generate = |rng: &mut Rng| EventsCase {
        events: (0..1 + rng.below(4)).map(|_| random_event(rng)).collect(),
        inner: (0..rng.below(3))
            .map(|_| (rng.below(4), rng.next_u64() as usize, 1 << rng.below(8)))
            .collect(),
        outer: (0..rng.below(2))
            .map(|_| (rng.next_u64() as usize, 1 << rng.below(8)))
            .collect(),
        cut: rng.chance(0.2).then(|| rng.next_u64() as usize),
    };
    let check = |case: &EventsCase| {
        let mut file = Vec::new();
        for (i, event) in case.events.iter().enumerate() {
            let mut data = encode_event(event.wall_time, event.step, &event.body);
            if case.inner.is_empty() {
                // Reference: the decoder gives back the event that was encoded.
                assert_eq!(decode_event(&data).as_ref(), Some(event));
            }
            for &(which, at, mask) in &case.inner {
                if which == i && !data.is_empty() {
                    let at = at % data.len();
                    data[at] ^= mask;
                }
            }
            let _ = decode_event(&data);
            file.extend(frame_record(&data));
        }
        for &(at, mask) in &case.outer {
            let at = at % file.len();
            file[at] ^= mask;
        }
        if let Some(cut) = case.cut {
            file.truncate(cut % (file.len() + 1));
        }
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("events.out.tfevents.0.fuzz");
        std::fs::write(&path, &file).unwrap();
        let read = read_log_dir(&dir);
        if case.inner.is_empty() && case.outer.is_empty() && case.cut.is_none() {
            // Nothing damaged: the folder reads back as written, less the scalar events that
            // a START after them purges (step at or past its step), as TensorBoard shows it.
            let mut shown: Vec<Event> = Vec::new();
            for event in &case.events {
                if event.body == EventBody::SessionStart {
                    shown.retain(|e| {
                        !matches!(e.body, EventBody::Scalars(_)) || e.step < event.step
                    });
                }
                shown.push(event.clone());
            }
            assert_eq!(read.as_ref().unwrap(), &shown);
        }
        Outcome::from(read)
    };
    run("TensorBoard event files", seed, cases, generate, check);
    let _ = std::fs::remove_dir_all(&dir);
}
