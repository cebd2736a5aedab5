//! An open network namespace file (`/proc/<pid>/ns/net`, `/var/run/netns/X`).

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::{NetlinkError, Result};

/// An open handle on a network namespace. Holding it keeps the namespace
/// alive even when its bind mount is removed.
#[derive(Debug)]
pub struct NetNs {
    file: File,
    path: String,
}

impl NetNs {
    /// Open a namespace by path (what the runtime passes in `CNI_NETNS`).
    pub fn open(path: &str) -> Result<Self> {
        let file = File::open(path).map_err(|source| NetlinkError::Netns {
            path: path.to_string(),
            source,
        })?;
        // Refuse regular files: setns() on them fails later with a less clear
        // error, and a wrong path must not be mistaken for a namespace.
        let fs_magic = nix::sys::statfs::fstatfs(&file).map_err(|e| NetlinkError::Netns {
            path: path.to_string(),
            source: std::io::Error::from_raw_os_error(e as i32),
        })?;
        let t = fs_magic.filesystem_type();
        if t != nix::sys::statfs::NSFS_MAGIC && t != nix::sys::statfs::PROC_SUPER_MAGIC {
            return Err(NetlinkError::Netns {
                path: path.to_string(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "not a network namespace file (nsfs)",
                ),
            });
        }
        Ok(Self {
            file,
            path: path.to_string(),
        })
    }

    /// The namespace of the calling thread.
    pub fn current() -> Result<Self> {
        Self::open("/proc/thread-self/ns/net")
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    pub(crate) fn try_clone(&self) -> Result<OwnedFd> {
        self.file
            .try_clone()
            .map(OwnedFd::from)
            .map_err(|source| NetlinkError::Netns {
                path: self.path.clone(),
                source,
            })
    }

    /// Another handle on the same namespace.
    pub fn duplicate(&self) -> Result<Self> {
        Ok(Self {
            file: File::from(self.try_clone()?),
            path: self.path.clone(),
        })
    }

    /// Runs `f` on a thread of its own that entered this namespace (what the calling thread's
    /// namespace decides: a netlink socket, an ioctl, `/proc/sys/net`); the thread ends with it,
    /// so its namespace change dies with it. `what` names `f` in its error.
    pub async fn run_in<T, F>(&self, what: &'static str, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> std::io::Result<T> + Send + 'static,
    {
        let fd = self.try_clone()?;
        let path = self.path.clone();
        let fail = move |source: std::io::Error| NetlinkError::Netns {
            path: path.clone(),
            source: std::io::Error::new(source.kind(), format!("{what}: {source}")),
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("kuryr-netns".into())
            .spawn(move || {
                let r = nix::sched::setns(&fd, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|e| std::io::Error::from_raw_os_error(e as i32))
                    .and_then(|()| f());
                let _ = tx.send(r);
            })
            .map_err(&fail)?;
        rx.await
            .map_err(|_| fail(std::io::Error::other("thread exited without an answer")))?
            .map_err(fail)
    }

    /// Inode identity, to tell whether two paths name the same namespace.
    pub fn inode(&self) -> Result<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        let md = self.file.metadata().map_err(|source| NetlinkError::Netns {
            path: self.path.clone(),
            source,
        })?;
        Ok((md.dev(), md.ino()))
    }
}
