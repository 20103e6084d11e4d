//! Where an optimizer's flat state lives: one type for a state buffer in
//! host memory or on the cubecl device of the parameters it updates, and
//! the named list of a rule's buffers that checkpoints save and load and
//! the driver moves to wherever the step runs.
//!
//! A rule keeps each buffer as a named field (`m`, `v`, `worker_error`, …)
//! of type [`Flat`] and lists them once ([`crate::FlatOptimizer::state`]).
//! The driver moves the listed buffers beside the parameters before each
//! step (to the host for a host step, to the device for a device step: a
//! no-op after the first), and a checkpoint reads and writes them where
//! they are, so state never has two copies that could disagree.

use std::borrow::Cow;

use cubecl::prelude::*;
use cubecl::server::Handle;
use terse_kernels::resident::filled;

use crate::DeviceFlat;
use crate::device_flat::{read_f32, upload_f32};

/// One flat f32 state buffer, on the host or on a cubecl device.
pub struct Flat {
    data: Data,
}

enum Data {
    Host(Vec<f32>),
    Device {
        client: Client,
        handle: Handle,
        len: usize,
    },
}

impl Flat {
    /// `len` zeros on the host, resident now (first touched in a later
    /// stage, whose first step would otherwise pay for faulting them in).
    pub(crate) fn zeros(len: usize) -> Self {
        Self::from_vec(filled(len, 0.0))
    }

    /// `values` on the host.
    pub(crate) fn from_vec(values: Vec<f32>) -> Self {
        Self {
            data: Data::Host(values),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.data {
            Data::Host(values) => values.len(),
            Data::Device { len, .. } => *len,
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values, on the host.
    ///
    /// # Panics
    /// When the buffer is on a device (a host step's driver moved it back
    /// before the step).
    pub(crate) fn host(&self) -> &[f32] {
        match &self.data {
            Data::Host(values) => values,
            Data::Device { .. } => panic!("a host pass over state kept on a device"),
        }
    }

    /// [`Flat::host`], mutable.
    pub(crate) fn host_mut(&mut self) -> &mut [f32] {
        match &mut self.data {
            Data::Host(values) => values,
            Data::Device { .. } => panic!("a host pass over state kept on a device"),
        }
    }

    /// The device buffer.
    ///
    /// # Panics
    /// When the buffer is on the host (a device step's driver moved it to
    /// the device before the step).
    pub(crate) fn handle(&self) -> &Handle {
        match &self.data {
            Data::Device { handle, .. } => handle,
            Data::Host(_) => panic!("a device pass over state kept on the host"),
        }
    }

    /// The device buffer, moved out (a one-element placeholder takes its
    /// place until [`Flat::put_handle`] returns it): for an API that takes
    /// buffers by value.
    pub(crate) fn take_handle(&mut self) -> Handle {
        match &mut self.data {
            Data::Device { client, handle, .. } => {
                let placeholder = client.empty(size_of::<f32>());
                std::mem::replace(handle, placeholder)
            }
            Data::Host(_) => panic!("a device pass over state kept on the host"),
        }
    }

    /// Returns (or replaces) the device buffer after [`Flat::take_handle`].
    pub(crate) fn put_handle(&mut self, new: Handle) {
        match &mut self.data {
            Data::Device { handle, .. } => *handle = new,
            Data::Host(_) => panic!("a device pass over state kept on the host"),
        }
    }

    /// Moves the values to `like`'s device (nothing when already there).
    pub(crate) fn move_to_device(&mut self, like: &DeviceFlat) {
        if let Data::Host(values) = &self.data {
            let client = like.client().clone();
            let handle = upload_f32(&client, values);
            let len = values.len();
            self.data = Data::Device {
                client,
                handle,
                len,
            };
        }
    }

    /// Moves the values to the host (nothing when already there).
    pub(crate) fn move_to_host(&mut self) {
        if let Data::Device {
            client,
            handle,
            len,
        } = &self.data
        {
            self.data = Data::Host(read_f32(client, handle, *len));
        }
    }

    /// The values, copied to the host when on a device (which keeps them).
    pub(crate) fn read(&self) -> Cow<'_, [f32]> {
        match &self.data {
            Data::Host(values) => Cow::Borrowed(values),
            Data::Device {
                client,
                handle,
                len,
            } => Cow::Owned(read_f32(client, handle, *len)),
        }
    }

    /// Replaces the values with `values` (of the same length), where the
    /// buffer is.
    pub(crate) fn write(&mut self, values: &[f32]) {
        assert_eq!(values.len(), self.len(), "a state buffer's length is fixed");
        match &mut self.data {
            Data::Host(target) => target.copy_from_slice(values),
            Data::Device { client, handle, .. } => *handle = upload_f32(client, values),
        }
    }
}

/// The parameters or the gradient of one step, borrowed where the caller
/// keeps them: host memory, or a buffer on a cubecl device.
pub enum FlatMut<'a> {
    /// On the host.
    Host(&'a mut [f32]),
    /// On a cubecl device.
    Device(&'a mut DeviceFlat),
}

impl FlatMut<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            FlatMut::Host(values) => values.len(),
            FlatMut::Device(buffer) => buffer.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device buffer, `None` on the host.
    pub(crate) fn device(&self) -> Option<&DeviceFlat> {
        match self {
            FlatMut::Host(_) => None,
            FlatMut::Device(buffer) => Some(buffer),
        }
    }

    /// The values, on the host.
    ///
    /// # Panics
    /// On a device (a pass's host arm runs only for host steps).
    pub(crate) fn host(&self) -> &[f32] {
        match self {
            FlatMut::Host(values) => values,
            FlatMut::Device(_) => panic!("a host pass over a device buffer"),
        }
    }

    /// [`FlatMut::host`], mutable.
    pub(crate) fn host_mut(&mut self) -> &mut [f32] {
        match self {
            FlatMut::Host(values) => values,
            FlatMut::Device(_) => panic!("a host pass over a device buffer"),
        }
    }

    /// The device buffer.
    ///
    /// # Panics
    /// On the host (a pass's device arm runs only for device steps).
    pub(crate) fn on_device(&mut self) -> &mut DeviceFlat {
        match self {
            FlatMut::Device(buffer) => buffer,
            FlatMut::Host(_) => panic!("a device pass over a host buffer"),
        }
    }

    /// The device buffer's storage.
    pub(crate) fn handle(&self) -> &Handle {
        match self {
            FlatMut::Device(buffer) => buffer.handle(),
            FlatMut::Host(_) => panic!("a device pass over a host buffer"),
        }
    }
}

/// What a pass reads and writes of a buffer, whichever kind it is (state
/// or a step's parameters and gradient): its host values in a host step,
/// its device storage in a device step.
pub(crate) trait Buffer {
    fn host(&self) -> &[f32];
    fn host_mut(&mut self) -> &mut [f32];
    fn handle(&self) -> &Handle;
}

impl Buffer for Flat {
    fn host(&self) -> &[f32] {
        Flat::host(self)
    }
    fn host_mut(&mut self) -> &mut [f32] {
        Flat::host_mut(self)
    }
    fn handle(&self) -> &Handle {
        Flat::handle(self)
    }
}

impl Buffer for FlatMut<'_> {
    fn host(&self) -> &[f32] {
        FlatMut::host(self)
    }
    fn host_mut(&mut self) -> &mut [f32] {
        FlatMut::host_mut(self)
    }
    fn handle(&self) -> &Handle {
        FlatMut::handle(self)
    }
}
