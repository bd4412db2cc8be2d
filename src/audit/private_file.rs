//! State files readable by their owner only.
//!
//! The audit trail names users, clients and threads, so its files are
//! created mode 0600 whatever the process umask is: opened with that mode
//! (no moment where another user could open them) and then set to exactly
//! that mode (a umask can only remove bits, e.g. make it 0400).

use std::fs::{File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The mode of every file the audit trail creates.
pub const PRIVATE_MODE: u32 = 0o600;

/// Open `path` for appending, creating it mode 0600 if it does not exist.
/// An existing file keeps its mode: an operator may have widened it on
/// purpose (e.g. for a log shipper's group).
pub fn open_append_private(path: &Path) -> io::Result<File> {
    match OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(PRIVATE_MODE)
        .open(path)
    {
        Ok(file) => {
            file.set_permissions(Permissions::from_mode(PRIVATE_MODE))?;
            Ok(file)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            OpenOptions::new().append(true).open(path)
        }
        Err(e) => Err(e),
    }
}

/// Create `path` empty, mode 0600, unless it exists. SQLite treats an
/// empty file as a new database and gives its `-wal` and `-shm` files the
/// database file's mode, so this is how the whole database ends up 0600.
pub fn precreate_private(path: &Path) -> io::Result<()> {
    open_append_private(path).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::test_util::temp_path;
    use std::io::Write;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    /// Under the most permissive umask (which would otherwise give 0666)
    /// the file is still 0600. The umask is process-wide; clearing it for
    /// a moment can only widen other tests' new files, never break them.
    #[test]
    fn created_files_are_0600_whatever_the_umask() {
        let path = temp_path("private", "f");
        // SAFETY: umask(2) cannot fail and only changes the mode mask.
        let old = unsafe { umask(0) };
        let file = open_append_private(&path);
        unsafe { umask(old) };
        file.unwrap().write_all(b"x").unwrap();
        assert_eq!(mode(&path), 0o600);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn existing_files_are_appended_to_and_keep_their_mode() {
        let path = temp_path("private-existing", "f");
        std::fs::write(&path, b"a").unwrap();
        std::fs::set_permissions(&path, Permissions::from_mode(0o640)).unwrap();
        open_append_private(&path).unwrap().write_all(b"b").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"ab");
        assert_eq!(mode(&path), 0o640);
        let _ = std::fs::remove_file(&path);
    }

    extern "C" {
        fn umask(mask: u32) -> u32;
    }
}
