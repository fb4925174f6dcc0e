//! A netlink socket to the kernel, the few calls the agent makes with one:
//! the socket diagnostics of `sock_destroy` (`NETLINK_SOCK_DIAG`) and the
//! conntrack dump of `netfilter_flows` (`NETLINK_NETFILTER`). Each caller
//! lays out its own request body and reads its own messages; this holds
//! the socket, the `nlmsghdr` and the walk over a datagram of messages
//! (linux/netlink.h).
use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

pub(crate) const NLM_F_REQUEST: u16 = 0x01;
pub(crate) const NLM_F_ACK: u16 = 0x04;
pub(crate) const NLM_F_DUMP: u16 = 0x300;
pub(crate) const NLMSG_ERROR: u16 = 2;
pub(crate) const NLMSG_DONE: u16 = 3;
/// `struct nlmsghdr`.
pub(crate) const NLMSG_HDRLEN: usize = 16;

pub(crate) struct Netlink {
    fd: OwnedFd,
}

impl Netlink {
    /// A socket of netlink family `protocol` (`NETLINK_SOCK_DIAG`, ...).
    pub(crate) fn open(protocol: libc::c_int) -> io::Result<Self> {
        // SAFETY: plain socket(2); the fd is owned at once.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, protocol) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this fd; nothing else owns it.
        Ok(Self { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Sends one message to the kernel: a `nlmsghdr` of `kind` and
    /// `flags` (sequence 1), then `body`.
    pub(crate) fn send(&self, kind: u16, flags: u16, body: &[u8]) -> io::Result<()> {
        let mut msg = Vec::with_capacity(NLMSG_HDRLEN + body.len());
        msg.extend_from_slice(&u32::try_from(NLMSG_HDRLEN + body.len()).expect("small").to_ne_bytes());
        msg.extend_from_slice(&kind.to_ne_bytes());
        msg.extend_from_slice(&flags.to_ne_bytes());
        msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence
        msg.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel picks
        msg.extend_from_slice(body);
        // SAFETY: sends `msg.len()` initialized bytes; an unbound netlink
        // socket's default destination is the kernel (port 0).
        let sent = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if sent < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    /// Receives one datagram of messages into `buf` (retried when a signal
    /// interrupts); its length.
    pub(crate) fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            // SAFETY: writes at most `buf.len()` bytes into `buf`.
            let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if let Ok(n) = usize::try_from(n) {
                return Ok(n);
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}

/// The messages of one datagram: `(type, payload)` each, or `Err(())` for
/// a header whose length does not fit (the walk stops there).
pub(crate) fn messages(mut data: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8]), ()>> {
    std::iter::from_fn(move || {
        if data.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes(data[0..4].try_into().expect("4 bytes")) as usize;
        let kind = u16::from_ne_bytes(data[4..6].try_into().expect("2 bytes"));
        if len < NLMSG_HDRLEN || len > data.len() {
            data = &[];
            return Some(Err(()));
        }
        let payload = &data[NLMSG_HDRLEN..len];
        data = data.get(align(len)..).unwrap_or(&[]);
        Some(Ok((kind, payload)))
    })
}

/// `len` rounded up to netlink's 4-byte alignment (`NLMSG_ALIGN`,
/// `NLA_ALIGN`).
#[must_use]
pub(crate) const fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// The code of an `NLMSG_ERROR` payload (`struct nlmsgerr`): a negative
/// errno, 0 for an acknowledgement.
#[must_use]
pub(crate) fn error_code(payload: &[u8]) -> i32 {
    payload.get(..4).map_or(0, |b| i32::from_ne_bytes(b.try_into().expect("4 bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut m = u32::try_from(NLMSG_HDRLEN + payload.len()).unwrap().to_ne_bytes().to_vec();
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(payload);
        m.resize(m.len().next_multiple_of(4), 0);
        m
    }

    /// Messages are walked at their aligned lengths; a header longer than
    /// what is left ends the walk with an error.
    #[test]
    fn messages_are_walked_at_aligned_lengths() {
        let mut data = message(20, &[1, 2, 3]);
        data.extend(message(NLMSG_ERROR, &(-2i32).to_ne_bytes()));
        data.extend(message(NLMSG_DONE, &[]));
        let got: Vec<_> = messages(&data).collect();
        assert_eq!(
            got,
            [Ok((20, &[1u8, 2, 3][..])), Ok((NLMSG_ERROR, &(-2i32).to_ne_bytes()[..])), Ok((NLMSG_DONE, &[][..]))]
        );
        assert_eq!(error_code(got[1].unwrap().1), -2);
        let mut cut = message(20, &[0; 8]);
        cut.truncate(20);
        assert_eq!(messages(&cut).collect::<Vec<_>>(), [Err(())]);
    }
}
