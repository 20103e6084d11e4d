//! The compressed allreduce on a cubecl device with its messages there
//! ([`MessageBuffers`]): the worker's buffer and error, this rank's server
//! error, and the send and receive buffers of messages are device buffers,
//! every phase is a kernel, and the exchanges move the message buffers —
//! by their CUDA addresses through NCCL, or through a host copy of the
//! words for a communicator that takes host buffers (wgpu devices).

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::device::{self, DeviceCompressed, ReceivedCopies};
use crate::host_reads;
use crate::messages::{MessageAddresses, MessageBuffers, MessageGeometry};
use crate::onebit::{blocks_for, words_for};

/// One rank's side of the compressed allreduce on a device: `x` and its
/// worker error (`len` f32 each), its server error (`server_len` f32) and
/// the two message buffers, made at the first phase that needs them.
pub struct DeviceMessages {
    client: Client,
    len: usize,
    x: Handle,
    error: Handle,
    server_len: usize,
    server_error: Handle,
    send: Option<Handle>,
    recv: Option<Handle>,
}

impl DeviceMessages {
    /// Takes the buffers of one rank's compressed allreduce on `client`'s
    /// device: `x` and its worker error (`len` f32 each), and the server
    /// error of this rank's chunk (`server_len` f32). Kernels write them
    /// in place: one that another handle shares is copied first.
    pub fn new(
        client: Client,
        (x, error, len): (Handle, Handle, usize),
        (server_error, server_len): (Handle, usize),
    ) -> DeviceMessages {
        let owned = |handle: Handle, len: usize| {
            if handle.can_mut() {
                handle
            } else {
                device::optim::copied(&client, &handle, len)
            }
        };
        let (x, error) = (owned(x, len), owned(error, len));
        let server_error = owned(server_error, server_len);
        DeviceMessages {
            client,
            len,
            x,
            error,
            server_len,
            server_error,
            send: None,
            recv: None,
        }
    }

    /// `x`, the worker error and the server error back.
    pub fn into_parts(self) -> (Handle, Handle, Handle) {
        (self.x, self.error, self.server_error)
    }

    /// The send and receive buffers an earlier phase made (the exchanges
    /// come after the phase that writes what they send).
    fn made(&self) -> (&Handle, &Handle) {
        match (&self.send, &self.recv) {
            (Some(send), Some(recv)) => (send, recv),
            _ => panic!("an exchange before the phase that makes its buffers"),
        }
    }

    /// The send and receive buffers, each `words` u32.
    fn buffers(&mut self, words: usize) -> (Handle, Handle) {
        let client = &self.client;
        let mut make = || client.empty(words.max(1) * size_of::<u32>());
        let send = self.send.get_or_insert_with(&mut make).clone();
        let recv = self.recv.get_or_insert_with(make).clone();
        (send, recv)
    }
}

impl MessageBuffers for DeviceMessages {
    fn len(&self) -> usize {
        self.len
    }

    fn server_len(&self) -> usize {
        self.server_len
    }

    fn compress(&mut self, geometry: &MessageGeometry) {
        let (send, _) = self.buffers(geometry.all_messages());
        let (words, slots) = (words_for(self.len), geometry.layout.slots(self.len));
        let client = &self.client;
        let compressed = DeviceCompressed {
            bits: client.empty(words.max(1) * size_of::<u32>()),
            scales: client.empty(slots.max(1) * size_of::<f32>()),
        };
        let (x, error) = (&self.x, &self.error);
        device::compress_chunks(
            client,
            x,
            error,
            self.len,
            geometry.layout,
            geometry.scale,
            &compressed,
        );
        let count = geometry.ranks;
        device::pack_messages(client, &compressed, (words, slots), geometry, count, &send);
    }

    fn serve(&mut self, geometry: &MessageGeometry) {
        let mine = self.server_len;
        if mine == 0 {
            // A rank that owns no element sends a message of zeros.
            let zeros = vec![0u32; geometry.all_messages().max(1)];
            self.send = Some(self.client.create_from_slice(u32::as_bytes(&zeros)));
            return;
        }
        let (send, recv) = self.buffers(geometry.all_messages());
        let client = &self.client;
        // The host path's block: the whole chunk, or the configured one.
        let block = geometry.layout.block;
        let (words, blocks) = (words_for(mine), blocks_for(mine, block));
        let recompressed = DeviceCompressed {
            bits: client.empty(words * size_of::<u32>()),
            scales: client.empty(blocks * size_of::<f32>()),
        };
        let received = ReceivedCopies {
            messages: &recv,
            copies: geometry.ranks,
            message: geometry.message,
            sign_words: geometry.sign_words(),
        };
        let average = client.empty(mine * size_of::<f32>());
        device::average_and_recompress(
            client,
            &received,
            mine,
            block,
            geometry.scale,
            &average,
            &self.server_error,
            &recompressed,
        );
        device::pack_messages(client, &recompressed, (words, blocks), geometry, 1, &send);
    }

    fn decompress(&mut self, geometry: &MessageGeometry) {
        let (_, recv) = self.buffers(geometry.all_messages());
        device::decompress_messages(&self.client, &recv, geometry, &self.x);
    }

    fn with_device_addresses(&mut self, exchange: &mut dyn FnMut(MessageAddresses)) -> bool {
        let (send, recv) = self.made();
        device::with_cuda_addresses(&self.client, &[send, recv], |at| {
            exchange(MessageAddresses {
                send: at[0],
                recv: at[1],
            })
        })
        .is_some()
    }

    fn read_send(&mut self, words: usize) -> Vec<u32> {
        let mut read = host_reads::read_u32(&self.client, self.made().0.clone());
        read.truncate(words);
        read
    }

    fn write_recv(&mut self, words: &[u32]) {
        let words: &[u32] = if words.is_empty() { &[0] } else { words };
        self.recv = Some(self.client.create_from_slice(u32::as_bytes(words)));
    }
}
