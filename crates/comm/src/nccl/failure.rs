//! An NCCL call's failure as one line a user can act on. cudarc's `Debug`
//! of `NcclError` is the bare word "NcclError": it drops NCCL's code, and
//! NCCL says why (`/dev/shm` too small in a container, the same GPU in two
//! ranks, no usable network interface) only in its last warning, which it
//! prints only under `NCCL_DEBUG=WARN` but keeps for `ncclGetLastError`.

use std::ffi::{CStr, c_char};

use cudarc::nccl::result::NcclError;
use cudarc::nccl::sys::{self, ncclResult_t};

use super::backend;
use crate::CommError;

/// `call`'s failure with NCCL's code, NCCL's text for the code and its
/// last warning (each where the library gives it).
pub(super) fn nccl_failed(call: &str, error: &NcclError) -> CommError {
    let (text, last) = texts(error.0);
    backend(describe(call, error.0, text.as_deref(), last.as_deref()))
}

/// The line: `call: code (text); NCCL's last warning: … ` or, without a
/// warning, how to make NCCL print one.
fn describe(call: &str, code: ncclResult_t, text: Option<&str>, last: Option<&str>) -> String {
    let mut line = format!("{call}: {code:?}");
    if let Some(text) = text.filter(|t| !t.is_empty()) {
        line.push_str(&format!(" ({text})"));
    }
    match last.map(str::trim).filter(|l| !l.is_empty()) {
        Some(last) => line.push_str(&format!("; NCCL's last warning: {last}")),
        None => line.push_str("; NCCL_DEBUG=WARN makes NCCL print why"),
    }
    line
}

/// NCCL's text for `code` and its last warning, read from the loaded
/// library; `None` for what it lacks (`ncclGetLastError` is NCCL 2.13's,
/// and cudarc's lookup of a missing symbol panics, so each is looked up
/// first).
fn texts(code: ncclResult_t) -> (Option<String>, Option<String>) {
    // SAFETY: only opens the library by its names.
    if !unsafe { sys::is_culib_present() } {
        return (None, None);
    }
    // SAFETY: the library is present (above); looking a symbol up runs none of it.
    let has = |name: &[u8]| unsafe { sys::culib().get::<*const ()>(name).is_ok() };
    let owned = |text: *const c_char| {
        // SAFETY: NCCL returns a NUL-terminated string it owns (static for
        // the codes, its last-error buffer for the warning), or null.
        (!text.is_null()).then(|| {
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        })
    };
    // SAFETY: both symbols were found; the warning's communicator argument
    // is unused by NCCL and may be null.
    let text = has(b"ncclGetErrorString")
        .then(|| owned(unsafe { sys::ncclGetErrorString(code) }))
        .flatten();
    let last = has(b"ncclGetLastError")
        .then(|| owned(unsafe { sys::ncclGetLastError(std::ptr::null_mut()) }))
        .flatten();
    (text, last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_names_the_code_the_text_and_the_warning() {
        let line = describe(
            "ncclCommInitRank",
            ncclResult_t::ncclSystemError,
            Some("unhandled system error (run with NCCL_DEBUG=INFO for details)"),
            Some("Error while creating shared memory segment /dev/shm/nccl-x (size 9637888)\n"),
        );
        assert_eq!(
            line,
            "ncclCommInitRank: ncclSystemError (unhandled system error (run with NCCL_DEBUG=INFO \
             for details)); NCCL's last warning: Error while creating shared memory segment \
             /dev/shm/nccl-x (size 9637888)"
        );
        // No warning kept: how to get one.
        let line = describe("ncclSend", ncclResult_t::ncclInvalidUsage, None, Some(""));
        assert_eq!(
            line,
            "ncclSend: ncclInvalidUsage; NCCL_DEBUG=WARN makes NCCL print why"
        );
    }

    #[test]
    fn a_failure_without_the_library_still_names_the_code() {
        // This machine has no libnccl (CI's): the code alone, no panic.
        if unsafe { sys::is_culib_present() } {
            return;
        }
        let CommError::Backend { message, .. } =
            nccl_failed("ncclAllReduce", &NcclError(ncclResult_t::ncclRemoteError))
        else {
            panic!("not a backend error")
        };
        assert_eq!(
            message,
            "ncclAllReduce: ncclRemoteError; NCCL_DEBUG=WARN makes NCCL print why"
        );
    }
}
