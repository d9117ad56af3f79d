//! Stream and event handles and their C entry points (`cuStream*`, `cuEvent*`).
//!
//! Invariants: a `CUstream` / `CUevent` value is an opaque number from one counter (never 0,
//! 1 or 2, which are the null, legacy and per-thread streams), valid exactly while it is in its
//! registry; the null, `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD` handles all mean the
//! current context's legacy null stream. An event remembers the stream and sequence number of
//! its latest record: it is complete when that stream has run that item (never-recorded events
//! are complete).

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::sys::{CUcontext, CUevent, CUhostFn, CUresult, CUstream};

use super::context::{current, driver, Context};
use super::stream::{Item, Stream};
use super::{fail, out, status, StreamWork};

static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(0x1000);
static STREAMS: Mutex<Option<HashMap<usize, Arc<Stream>>>> = Mutex::new(None);
static EVENTS: Mutex<Option<HashMap<usize, Arc<Event>>>> = Mutex::new(None);

fn new_handle() -> usize {
    NEXT_HANDLE.fetch_add(0x10, Ordering::Relaxed)
}

/// The stream behind a `CUstream` (the special handles: the current context's null stream).
pub(crate) fn resolve_stream(handle: CUstream) -> Result<Arc<Stream>, CUresult> {
    let h = handle as usize;
    if h <= 2 {
        return current()?.null_stream();
    }
    driver()?;
    let streams = STREAMS.lock().unwrap_or_else(|e| e.into_inner());
    streams
        .as_ref()
        .and_then(|m| m.get(&h).cloned())
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

struct EventState {
    record: Option<(Arc<Stream>, u64)>,
    generation: u64,
    time: Option<Instant>,
}

/// An event.
pub(crate) struct Event {
    ctx: &'static Context,
    timing: bool,
    state: Mutex<EventState>,
}

impl Event {
    fn lock(&self) -> std::sync::MutexGuard<'_, EventState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_complete(&self) -> bool {
        self.lock()
            .record
            .as_ref()
            .is_none_or(|(s, seq)| s.is_done(*seq))
    }
}

fn resolve_event(handle: CUevent) -> Result<Arc<Event>, CUresult> {
    driver()?;
    let events = EVENTS.lock().unwrap_or_else(|e| e.into_inner());
    events
        .as_ref()
        .and_then(|m| m.get(&(handle as usize)).cloned())
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

fn create_stream(ph: *mut CUstream, flags: c_uint, priority: c_int) -> CUresult {
    let ctx = match current() {
        Ok(c) => c,
        Err(code) => return code,
    };
    if ph.is_null() || flags > 1 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    let handle = new_handle();
    let delay = driver().is_ok_and(|d| d.config.delay);
    let stream = match Stream::spawn(ctx, handle, false, flags, priority.clamp(-5, 0), delay) {
        Ok(s) => s,
        Err(e) => return fail("cuStreamCreate", CUresult::CUDA_ERROR_OUT_OF_MEMORY, e),
    };
    ctx.add_stream(&stream);
    STREAMS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(handle, stream);
    // SAFETY: checked not null above; the caller's out-pointer.
    unsafe { out(ph, handle as CUstream) }
}

/// `cuStreamCreate` (flags: 0, or `CU_STREAM_NON_BLOCKING`).
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(phStream: *mut CUstream, Flags: c_uint) -> CUresult {
    super::trace("cuStreamCreate");
    create_stream(phStream, Flags, 0)
}

/// `cuStreamCreateWithPriority` (priorities clamp to the range -5..=0).
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    phStream: *mut CUstream,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    super::trace("cuStreamCreateWithPriority");
    create_stream(phStream, flags, priority)
}

/// `cuStreamDestroy_v2`: returns at once; queued work still runs.
#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(hStream: CUstream) -> CUresult {
    super::trace("cuStreamDestroy_v2");
    if (hStream as usize) <= 2 {
        return CUresult::CUDA_ERROR_INVALID_HANDLE;
    }
    let removed = STREAMS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
        .and_then(|m| m.remove(&(hStream as usize)));
    match removed {
        Some(stream) => {
            stream.ctx.remove_stream(&stream);
            stream.close();
            CUresult::CUDA_SUCCESS
        }
        None => CUresult::CUDA_ERROR_INVALID_HANDLE,
    }
}

/// `cuStreamSynchronize`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(hStream: CUstream) -> CUresult {
    super::trace("cuStreamSynchronize");
    status(resolve_stream(hStream).and_then(|s| s.synchronize()))
}

/// `cuStreamQuery`: `CUDA_ERROR_NOT_READY` while work is queued or running.
#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(hStream: CUstream) -> CUresult {
    super::trace("cuStreamQuery");
    match resolve_stream(hStream) {
        Ok(s) => match s.ctx.sticky() {
            Some(code) => code,
            None if s.is_idle() => CUresult::CUDA_SUCCESS,
            None => CUresult::CUDA_ERROR_NOT_READY,
        },
        Err(code) => code,
    }
}

/// `cuStreamWaitEvent`: later work on the stream waits for the event's latest record.
#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(
    hStream: CUstream,
    hEvent: CUevent,
    Flags: c_uint,
) -> CUresult {
    super::trace("cuStreamWaitEvent");
    let (stream, event) = match (resolve_stream(hStream), resolve_event(hEvent)) {
        (Ok(s), Ok(e)) => (s, e),
        (Err(code), _) | (_, Err(code)) => return code,
    };
    if Flags > 1 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    if let Err(code) = stream.ctx.check() {
        return code;
    }
    if let Some((source, seq)) = event.lock().record.clone() {
        stream.wait_on(&source, seq);
    }
    CUresult::CUDA_SUCCESS
}

/// `cuStreamGetPriority`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetPriority(hStream: CUstream, priority: *mut c_int) -> CUresult {
    super::trace("cuStreamGetPriority");
    match resolve_stream(hStream) {
        // SAFETY: the caller's out-pointer (checked for null).
        Ok(s) => unsafe { out(priority, s.priority) },
        Err(code) => code,
    }
}

/// `cuStreamGetFlags`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags(hStream: CUstream, flags: *mut c_uint) -> CUresult {
    super::trace("cuStreamGetFlags");
    match resolve_stream(hStream) {
        // SAFETY: the caller's out-pointer (checked for null).
        Ok(s) => unsafe { out(flags, s.flags) },
        Err(code) => code,
    }
}

/// `cuStreamGetCtx`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx(hStream: CUstream, pctx: *mut CUcontext) -> CUresult {
    super::trace("cuStreamGetCtx");
    match resolve_stream(hStream) {
        // SAFETY: the caller's out-pointer (checked for null).
        Ok(s) => unsafe { out(pctx, s.ctx.handle()) },
        Err(code) => code,
    }
}

/// `cuStreamIsCapturing`: graph capture is not emulated, so never.
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(
    hStream: CUstream,
    captureStatus: *mut c_uint,
) -> CUresult {
    super::trace("cuStreamIsCapturing");
    match resolve_stream(hStream) {
        // SAFETY: the caller's out-pointer (checked for null); 0 is CU_STREAM_CAPTURE_STATUS_NONE.
        Ok(_) => unsafe { out(captureStatus, 0) },
        Err(code) => code,
    }
}

/// `cuLaunchHostFunc`: runs `fn_(userData)` on the stream's worker, in order.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchHostFunc(
    hStream: CUstream,
    fn_: CUhostFn,
    userData: *mut c_void,
) -> CUresult {
    super::trace("cuLaunchHostFunc");
    let Some(func) = fn_ else {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    };
    let data = userData as usize;
    let work = Box::new(move || {
        // SAFETY: the caller promised `func` may be called with `userData` from the stream.
        unsafe { func(data as *mut c_void) };
        Ok(())
    });
    status(enqueue(hStream, work))
}

/// `cuEventCreate` (flags: `CU_EVENT_BLOCKING_SYNC`, `CU_EVENT_DISABLE_TIMING`,
/// `CU_EVENT_INTERPROCESS`).
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(phEvent: *mut CUevent, Flags: c_uint) -> CUresult {
    super::trace("cuEventCreate");
    let ctx = match current() {
        Ok(c) => c,
        Err(code) => return code,
    };
    if phEvent.is_null() || Flags & !0x7 != 0 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    let handle = new_handle();
    let event = Arc::new(Event {
        ctx,
        timing: Flags & 0x2 == 0,
        state: Mutex::new(EventState {
            record: None,
            generation: 0,
            time: None,
        }),
    });
    EVENTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(handle, event);
    // SAFETY: checked not null above.
    unsafe { out(phEvent, handle as CUevent) }
}

/// `cuEventRecord`: the event completes when the stream reaches this point.
#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(hEvent: CUevent, hStream: CUstream) -> CUresult {
    super::trace("cuEventRecord");
    let (event, stream) = match (resolve_event(hEvent), resolve_stream(hStream)) {
        (Ok(e), Ok(s)) => (e, s),
        (Err(code), _) | (_, Err(code)) => return code,
    };
    if !std::ptr::eq(event.ctx, stream.ctx) {
        return fail(
            "cuEventRecord",
            CUresult::CUDA_ERROR_INVALID_HANDLE,
            "the event and the stream belong to different contexts",
        );
    }
    if let Err(code) = stream.ctx.check() {
        return code;
    }
    let mut st = event.lock();
    st.generation += 1;
    st.time = None;
    let generation = st.generation;
    let marker = event.clone();
    let seq = stream.submit(Item::Control(Box::new(move || {
        let mut st = marker.lock();
        if st.generation == generation {
            st.time = Some(Instant::now());
        }
    })));
    st.record = Some((stream, seq));
    CUresult::CUDA_SUCCESS
}

/// `cuEventQuery`.
#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(hEvent: CUevent) -> CUresult {
    super::trace("cuEventQuery");
    match resolve_event(hEvent) {
        Ok(e) => match e.ctx.sticky() {
            Some(code) => code,
            None if e.is_complete() => CUresult::CUDA_SUCCESS,
            None => CUresult::CUDA_ERROR_NOT_READY,
        },
        Err(code) => code,
    }
}

/// `cuEventSynchronize`.
#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(hEvent: CUevent) -> CUresult {
    super::trace("cuEventSynchronize");
    let event = match resolve_event(hEvent) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let record = event.lock().record.clone();
    if let Some((stream, seq)) = record {
        stream.wait_for(seq);
    }
    status(event.ctx.check())
}

unsafe fn elapsed(ms: *mut f32, start: CUevent, end: CUevent) -> CUresult {
    let (a, b) = match (resolve_event(start), resolve_event(end)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(code), _) | (_, Err(code)) => return code,
    };
    if !a.timing || !b.timing {
        return CUresult::CUDA_ERROR_INVALID_HANDLE;
    }
    let (sa, sb) = (a.lock().record.is_some(), b.lock().record.is_some());
    if !sa || !sb {
        return CUresult::CUDA_ERROR_INVALID_HANDLE;
    }
    if !a.is_complete() || !b.is_complete() {
        return CUresult::CUDA_ERROR_NOT_READY;
    }
    let times = (a.lock().time, b.lock().time);
    match times {
        (Some(ta), Some(tb)) => {
            let ms_value = if tb >= ta {
                tb.duration_since(ta).as_secs_f64() * 1e3
            } else {
                -(ta.duration_since(tb).as_secs_f64() * 1e3)
            };
            // SAFETY: the caller's out-pointer (checked for null).
            unsafe { out(ms, ms_value as f32) }
        }
        // Recorded while the context was faulted: no timestamp.
        _ => CUresult::CUDA_ERROR_INVALID_HANDLE,
    }
}

/// `cuEventElapsedTime`.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    pMilliseconds: *mut f32,
    hStart: CUevent,
    hEnd: CUevent,
) -> CUresult {
    super::trace("cuEventElapsedTime");
    // SAFETY: forwarded out-pointer.
    unsafe { elapsed(pMilliseconds, hStart, hEnd) }
}

/// `cuEventElapsedTime_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    pMilliseconds: *mut f32,
    hStart: CUevent,
    hEnd: CUevent,
) -> CUresult {
    super::trace("cuEventElapsedTime_v2");
    // SAFETY: forwarded out-pointer.
    unsafe { elapsed(pMilliseconds, hStart, hEnd) }
}

/// `cuEventDestroy_v2`: pending records still complete.
#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(hEvent: CUevent) -> CUresult {
    super::trace("cuEventDestroy_v2");
    let removed = EVENTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
        .and_then(|m| m.remove(&(hEvent as usize)));
    match removed {
        Some(_) => CUresult::CUDA_SUCCESS,
        None => CUresult::CUDA_ERROR_INVALID_HANDLE,
    }
}

/// Queues `work` on `stream` (null: the current context's default stream) and returns at once.
/// Errors: an invalid or destroyed stream, no current context, a context with a sticky error.
pub fn enqueue(stream: CUstream, work: StreamWork) -> Result<(), CUresult> {
    let s = resolve_stream(stream)?;
    s.ctx.check()?;
    s.submit(Item::Work(work));
    Ok(())
}

/// Blocks until everything queued on `stream` so far has run; returns the stream's error if any.
pub fn synchronize_stream(stream: CUstream) -> Result<(), CUresult> {
    resolve_stream(stream)?.synchronize()
}

/// The ordinal of the device `stream` belongs to (null: the current context's).
pub fn stream_device(stream: CUstream) -> Result<i32, CUresult> {
    resolve_stream(stream).map(|s| s.ctx.device)
}
