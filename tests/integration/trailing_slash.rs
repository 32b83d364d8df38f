//! Tool paths written with a trailing `/` name directories, as syscalls read them: a file
//! there answers the not-a-directory error (and is left alone) rather than being acted on.

use agentvfs::control::client::Client;
use serde_json::{json, Value};

use crate::harness::Fixture;

/// A fixture with `/host/file.txt`, `/host/link -> file.txt` and `/host/dir/inner.txt`.
fn fixture() -> (Fixture, Client) {
    let f = Fixture::new("");
    std::fs::write(f.host_root.join("file.txt"), "content\n").unwrap();
    std::os::unix::fs::symlink("file.txt", f.host_root.join("link")).unwrap();
    std::fs::create_dir(f.host_root.join("dir")).unwrap();
    std::fs::write(f.host_root.join("dir/inner.txt"), "content\n").unwrap();
    let client = Client::connect(&f.scratch.path().join("agentvfs.sock")).unwrap();
    (f, client)
}

fn call(client: &mut Client, name: &str, arguments: Value) -> Value {
    client.call("tools/call", Some(json!({"name": name, "arguments": arguments}))).unwrap()
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or("")
}

/// The call fails with `code` and `message`.
fn fails(client: &mut Client, name: &str, arguments: Value, code: &str, message: &str) {
    let r = call(client, name, arguments.clone());
    assert_eq!(r["isError"], json!(true), "{name} {arguments}: {r}");
    assert_eq!(r["structuredContent"]["error_code"], code, "{name} {arguments}: {r}");
    assert_eq!(text(&r), message, "{name} {arguments}");
}

/// The errno the kernel gives the same path through the mount.
fn errno(result: std::io::Result<impl Sized>) -> Option<i32> {
    result.err().and_then(|e| e.raw_os_error())
}

fn content(f: &Fixture, rel: &str) -> String {
    std::fs::read_to_string(f.host_root.join(rel)).unwrap()
}

#[test]
fn delete_of_a_file_written_as_a_directory_fails_and_keeps_it() {
    let (f, mut c) = fixture();
    let through_mount = |rel: &str| f.p(&format!("/host/{rel}/"));
    assert_eq!(errno(std::fs::remove_file(through_mount("file.txt"))), Some(libc::ENOTDIR));
    let not_dir = |p: &str| format!("Error deleting '{p}': [Errno 20] Not a directory: '{p}'");
    fails(
        &mut c,
        "delete",
        json!({"file_path": "/host/file.txt/"}),
        "FS_NOT_DIRECTORY",
        &not_dir("/host/file.txt/"),
    );
    assert_eq!(content(&f, "file.txt"), "content\n");
    // A symlink is not a directory either (unlink and rmdir of `link/` answer ENOTDIR).
    assert_eq!(errno(std::fs::remove_file(through_mount("link"))), Some(libc::ENOTDIR));
    fails(&mut c, "delete", json!({"file_path": "/host/link/"}), "FS_NOT_DIRECTORY", &not_dir("/host/link/"));
    assert!(f.host_root.join("link").symlink_metadata().is_ok());
    fails(
        &mut c,
        "delete",
        json!({"file_path": "/host/file.txt/."}),
        "FS_NOT_DIRECTORY",
        &not_dir("/host/file.txt/"),
    );
    // A directory may be written either way.
    let r = call(&mut c, "delete", json!({"file_path": "/host/dir/"}));
    assert_eq!((text(&r), &r["isError"]), ("Deleted /host/dir", &json!(false)), "{r}");
    assert!(!f.host_root.join("dir").exists());
    let r = call(&mut c, "delete", json!({"file_path": "/host/file.txt"}));
    assert_eq!(r["isError"], json!(false), "{r}");
}

#[test]
fn reads_writes_and_edits_of_a_file_written_as_a_directory_fail() {
    let (f, mut c) = fixture();
    let open = |rel: &str| std::fs::File::open(f.p(&format!("/host/{rel}")));
    assert_eq!(errno(open("file.txt/")), Some(libc::ENOTDIR));
    let reading = |p: &str| format!("Error: Error reading file '{p}': [Errno 20] Not a directory: '{p}'");
    fails(
        &mut c,
        "read_file",
        json!({"file_path": "/host/file.txt/"}),
        "FS_NOT_DIRECTORY",
        &reading("/host/file.txt/"),
    );
    fails(
        &mut c,
        "read_file",
        json!({"file_path": "/host/link/"}),
        "FS_NOT_DIRECTORY",
        &reading("/host/link/"),
    );

    let write = |p: &str| json!({"file_path": p, "content": "replaced"});
    fails(
        &mut c,
        "write_file",
        write("/host/file.txt/"),
        "FS_NOT_DIRECTORY",
        "Error writing file '/host/file.txt/': [Errno 20] Not a directory: '/host/file.txt/'",
    );
    assert_eq!(content(&f, "file.txt"), "content\n");
    // A new file cannot be made under a name written as a directory: open(O_CREAT) says EISDIR.
    let create = std::fs::File::create(f.p("/host/new.txt/"));
    assert_eq!(errno(create), Some(libc::EISDIR));
    fails(
        &mut c,
        "write_file",
        write("/host/sub/new.txt/"),
        "FS_IS_DIRECTORY",
        "Error writing file '/host/sub/new.txt/': [Errno 21] Is a directory: '/host/sub/new.txt/'",
    );
    assert!(!f.host_root.join("sub").exists(), "nothing was created");

    assert_eq!(call(&mut c, "read_file", json!({"file_path": "/host/file.txt"}))["isError"], json!(false));
    fails(
        &mut c,
        "edit_file",
        json!({"file_path": "/host/file.txt/", "old_string": "content", "new_string": "edited"}),
        "FS_NOT_DIRECTORY",
        "Error editing file '/host/file.txt/': [Errno 20] Not a directory: '/host/file.txt/'",
    );
    assert_eq!(content(&f, "file.txt"), "content\n");
    // Without the slash each still works on the file.
    let r = call(&mut c, "write_file", write("/host/file.txt"));
    assert_eq!(r["isError"], json!(false), "{r}");
    assert_eq!(content(&f, "file.txt"), "replaced");
}

#[test]
fn listing_and_searching_from_a_file_written_as_a_directory_fail() {
    let (f, mut c) = fixture();
    assert_eq!(errno(std::fs::read_dir(f.p("/host/file.txt/"))), Some(libc::ENOTDIR));
    fails(
        &mut c,
        "ls",
        json!({"path": "/host/file.txt/"}),
        "FS_NOT_DIRECTORY",
        "Error: Path '/host/file.txt': not_a_directory",
    );
    let not_dir = "Error: Path '/host/file.txt/': not_a_directory";
    fails(&mut c, "glob", json!({"pattern": "*", "path": "/host/file.txt/"}), "FS_NOT_DIRECTORY", not_dir);
    fails(
        &mut c,
        "grep",
        json!({"pattern": "content", "path": "/host/file.txt/"}),
        "FS_NOT_DIRECTORY",
        not_dir,
    );
    // Without the slash a file is searched (grep) or has nothing beneath it (glob), as before,
    // and a directory may be written either way.
    assert_eq!(
        text(&call(&mut c, "grep", json!({"pattern": "content", "path": "/host/file.txt"}))),
        "/host/file.txt"
    );
    assert_eq!(
        text(&call(&mut c, "glob", json!({"pattern": "*", "path": "/host/file.txt"}))),
        "No files found"
    );
    let r = call(&mut c, "grep", json!({"pattern": "content", "path": "/host/dir/"}));
    assert_eq!(text(&r), "/host/dir/inner.txt", "{r}");
    let r = call(&mut c, "ls", json!({"path": "/host/dir/"}));
    assert_eq!(text(&r), "['/host/dir/inner.txt']", "{r}");
    assert_eq!(content(&f, "file.txt"), "content\n");
}
