//! Terminals for background processes: the supervisor opens a pseudo-terminal, gives its
//! terminal side to the process as stdin, stdout and stderr, and keeps the other side to read
//! its output, type its input and set its size. The process becomes a session leader with the
//! terminal as its controlling terminal through `daiv-sandbox-helper pty-exec` (the workspace
//! forbids `unsafe`, so no `pre_exec`): job control, `stty`, line editing and full-screen
//! programs work as in a terminal.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

use rustix::fd::OwnedFd;
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;
use sandbox_protocol::message::PtySize;

/// A new terminal of `size`: its controlling side (kept by the supervisor) and its terminal
/// side (the process's stdin, stdout and stderr).
pub fn open(size: PtySize) -> std::io::Result<(File, File)> {
    let master: OwnedFd =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let name = rustix::pty::ptsname(&master, Vec::new())?;
    resize(&master, size)?;
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(rustix::fs::OFlags::NOCTTY.bits() as i32)
        .open(OsStr::new(&*String::from_utf8_lossy(name.as_bytes())))?;
    Ok((File::from(master), slave))
}

/// Sets the terminal's size (the kernel tells its foreground process group with SIGWINCH).
pub fn resize(master: impl rustix::fd::AsFd, size: PtySize) -> std::io::Result<()> {
    rustix::termios::tcsetwinsize(
        master,
        Winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )?;
    Ok(())
}

/// `pty-exec -- cmd...`: a new session whose controlling terminal is stdin, then `cmd`.
pub fn exec(cmd: &[&str]) -> ExitCode {
    let setup = rustix::process::setsid()
        .map_err(std::io::Error::from)
        .and_then(|_| rustix::process::ioctl_tiocsctty(std::io::stdin()).map_err(Into::into));
    if let Err(e) = setup {
        eprintln!("daiv-sandbox-helper: no terminal for the process: {e}");
        return ExitCode::from(127);
    }
    let e = Command::new(cmd[0]).args(&cmd[1..]).exec();
    eprintln!("daiv-sandbox-helper: cannot start {}: {e}", cmd[0]);
    ExitCode::from(127)
}
