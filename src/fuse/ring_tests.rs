//! Unit tests of the FUSE ring's wire layout: requests rebuilt, replies split, commands
//! encoded, CPU lists counted.

use super::*;

fn header_with(total: u32, unique: u64, commit_id: u64, payload: u32) -> Box<[u8; HEADER_BUFFER]> {
    let mut header = Box::new([0u8; HEADER_BUFFER]);
    header[..4].copy_from_slice(&total.to_ne_bytes());
    header[4..8].copy_from_slice(&1u32.to_ne_bytes()); // LOOKUP
    header[8..16].copy_from_slice(&unique.to_ne_bytes());
    header[COMMIT_ID_AT..COMMIT_ID_AT + 8].copy_from_slice(&commit_id.to_ne_bytes());
    header[PAYLOAD_SIZE_AT..PAYLOAD_SIZE_AT + 4].copy_from_slice(&payload.to_ne_bytes());
    header
}

#[test]
fn a_request_is_rebuilt_in_the_classic_layout() {
    // A 16-byte operation header (say GETATTR's) and 6 bytes of arguments.
    let mut header = header_with(40 + 16 + 6, 77, 9, 6);
    header[OP_HEADER_AT..OP_HEADER_AT + 16].copy_from_slice(&[5u8; 16]);
    header[OP_HEADER_AT + 16] = 0xEE; // past the operation header: not part of it
    let payload = *b"name\0\0unused";
    let mut request = Vec::new();
    assert_eq!(read_request(&header, &payload, &mut request), (77, 9));
    assert_eq!(request.len(), 62);
    assert_eq!(u32_at(&request, 0), 62);
    assert_eq!(&request[4..40], &header[4..40]);
    assert_eq!(&request[40..56], &[5u8; 16]);
    assert_eq!(&request[56..], b"name\0\0");
}

#[test]
fn a_request_without_operation_header_is_its_arguments() {
    // LOOKUP: the name only.
    let header = header_with(40 + 4, 1, 2, 4);
    let mut request = vec![1, 2, 3];
    read_request(&header, b"abc\0", &mut request);
    assert_eq!(request.len(), 44);
    assert_eq!(&request[40..], b"abc\0");
}

#[test]
fn a_reply_is_split_into_out_header_and_payload_however_it_is_sliced() {
    let mut out = Vec::new();
    out.extend_from_slice(&26u32.to_ne_bytes());
    out.extend_from_slice(&0i32.to_ne_bytes());
    out.extend_from_slice(&77u64.to_ne_bytes());
    out.extend_from_slice(b"0123456789");
    for cuts in [vec![26], vec![16, 10], vec![3, 20, 3], vec![0, 16, 0, 10]] {
        let mut slices = Vec::new();
        let mut at = 0;
        for cut in cuts {
            slices.push(IoSlice::new(&out[at..at + cut]));
            at += cut;
        }
        let mut header = Box::new([0u8; HEADER_BUFFER]);
        let mut payload = vec![0u8; 32];
        write_reply(&slices, &mut header, &mut payload);
        assert_eq!(&header[..16], &out[..16]);
        assert_eq!(&payload[..10], b"0123456789");
        assert_eq!(u32_at(&header[..], PAYLOAD_SIZE_AT), 10);
    }
}

#[test]
fn a_reply_too_large_for_the_payload_becomes_eio() {
    let mut out = Vec::new();
    out.extend_from_slice(&(16u32 + 64).to_ne_bytes());
    out.extend_from_slice(&0i32.to_ne_bytes());
    out.extend_from_slice(&5u64.to_ne_bytes());
    out.extend_from_slice(&[7u8; 64]);
    let mut header = Box::new([0u8; HEADER_BUFFER]);
    let mut payload = vec![0u8; 32];
    write_reply(&[IoSlice::new(&out)], &mut header, &mut payload);
    assert_eq!(u32_at(&header[..], 0), 16);
    assert_eq!(i32::from_ne_bytes(header[4..8].try_into().unwrap()), -libc::EIO);
    assert_eq!(u64_at(&header[..], 8), 5);
    assert_eq!(u32_at(&header[..], PAYLOAD_SIZE_AT), 0);
    assert_eq!(payload, vec![0u8; 32]);
}

#[test]
fn register_and_commit_commands_carry_the_kernel_fields() {
    let iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 2];
    let raw = |sqe: squeue::Entry128| -> [u8; 128] { unsafe { std::mem::transmute(sqe) } };
    let register = raw(uring_cmd(7, CMD_REGISTER, 3, 0, Some(iov.as_ptr()), 42));
    assert_eq!(register[0], opcode::UringCmd80::CODE);
    assert_eq!(i32::from_ne_bytes(register[4..8].try_into().unwrap()), 7);
    assert_eq!(u32_at(&register, 8), CMD_REGISTER); // cmd_op
    assert_eq!(u64_at(&register, 16), iov.as_ptr() as u64); // addr
    assert_eq!(u32_at(&register, 24), 2); // len: two iovecs
    assert_eq!(u64_at(&register, 32), 42); // user_data
    assert_eq!(u16::from_ne_bytes(register[64..66].try_into().unwrap()), 3); // qid
    let commit = raw(uring_cmd(7, CMD_COMMIT_AND_FETCH, 1, 99, None, 5));
    assert_eq!(u32_at(&commit, 8), CMD_COMMIT_AND_FETCH);
    assert_eq!(u64_at(&commit, 48 + 8), 99); // commit_id
    assert_eq!(u16::from_ne_bytes(commit[64..66].try_into().unwrap()), 1);
    assert_eq!(u32_at(&commit, 24), 0);
}

#[test]
fn cpu_lists_count_up_to_the_last_id() {
    assert_eq!(cpus_in_list("0-1\n"), Some(2));
    assert_eq!(cpus_in_list("0"), Some(1));
    assert_eq!(cpus_in_list("0-3,8-11"), Some(12));
    assert_eq!(cpus_in_list("garbage"), None);
}
