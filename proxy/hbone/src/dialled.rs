//! A tunnel connection as the caller dialled it for the pool
//! ([`Dialled`]: the byte stream and until when it may carry new streams),
//! and the rule both ends share for moving on before a certificate expires
//! ([`move_on_at`]). A leaf.

use std::time::{Duration, SystemTime};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

/// At most this long before the first certificate of a tunnel connection
/// expires (either end's), the connection takes no new stream: a client
/// opens its next stream on a new connection, a server sends its graceful
/// GOAWAY. A tenth of what is left at the handshake, when that is less.
pub const EXPIRY_MARGIN: Duration = Duration::from_secs(30);

/// When a connection authenticated with a certificate that expires at
/// `expiry` stops taking new streams: [`EXPIRY_MARGIN`] before it, or a
/// tenth of what is left now if that is less (so a connection made with a
/// short-lived certificate is still used for most of its life). Now, when
/// `expiry` is past.
pub fn move_on_at(expiry: SystemTime) -> Instant {
    let left = expiry.duration_since(SystemTime::now()).unwrap_or_default();
    let margin = EXPIRY_MARGIN.min(left / 10);
    Instant::now() + (left - margin)
}

/// A connection dialled for the pool: the byte stream (TCP and TLS, the
/// caller's) and, when known, when the first of the certificates it was
/// authenticated with expires (the server's leaf, or the one this end
/// presented). The pool opens no new stream on it from
/// [`move_on_at`] that expiry on; its open streams go on. A dial may give
/// a bare stream instead (no expiry known, see [`IntoDialled`]).
#[derive(Debug)]
pub struct Dialled<IO> {
    pub(crate) io: IO,
    pub(crate) move_on: Option<Instant>,
}

impl<IO> Dialled<IO> {
    /// `io`, with no expiry known.
    pub fn new(io: IO) -> Self {
        Dialled { io, move_on: None }
    }

    /// `io`, authenticated with certificates the first of which expires at
    /// `expiry` (`None`: unknown, the connection is used until it ends).
    pub fn expiring(io: IO, expiry: Option<SystemTime>) -> Self {
        Dialled {
            io,
            move_on: expiry.map(move_on_at),
        }
    }

    /// The byte stream.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// From when the pool opens no new stream on it (`None`: never for an
    /// expiry).
    pub fn move_on(&self) -> Option<Instant> {
        self.move_on
    }
}

/// What a dial may give the pool: a [`Dialled`] connection, or a bare
/// byte stream (no expiry known).
pub trait IntoDialled {
    /// The byte stream.
    type Io;
    /// As a [`Dialled`] connection.
    fn into_dialled(self) -> Dialled<Self::Io>;
}

impl<IO> IntoDialled for Dialled<IO> {
    type Io = IO;
    fn into_dialled(self) -> Dialled<IO> {
        self
    }
}

impl<IO: AsyncRead + AsyncWrite> IntoDialled for IO {
    type Io = IO;
    fn into_dialled(self) -> Dialled<IO> {
        Dialled::new(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_moves_on_a_tenth_of_its_life_before_a_short_expiry_and_30_s_before_a_long_one()
    {
        let now = Instant::now();
        let short = move_on_at(SystemTime::now() + Duration::from_secs(10));
        let left = short - now;
        assert!(
            left > Duration::from_millis(8_800) && left < Duration::from_millis(9_100),
            "{left:?}"
        );
        let long = move_on_at(SystemTime::now() + Duration::from_secs(3600));
        let left = long - now;
        assert!(
            left > Duration::from_secs(3569) && left < Duration::from_millis(3_570_100),
            "{left:?}"
        );
        // Past: at once.
        let past = move_on_at(SystemTime::now() - Duration::from_secs(1));
        assert!(past <= Instant::now());
    }
}
