// Reading an HDF5 file that may be damaged without letting the damage harm mxlab.
//
// On a file whose metadata is corrupt (a few changed bytes in an object header, a B-tree or the
// global heap that holds variable-length strings), the HDF5 library (1.10.8 measured) does not
// always return an error: it can crash with SIGSEGV inside its own decoders (a string's heap
// entry whose length runs past its heap, an attribute message whose size runs off its header),
// allocate and clear gigabytes for a length that was never written, or copy past a buffer and
// corrupt the heap, which kills the process later (SIGABRT in free()) or not at all. That
// happens inside the first API call that decodes the damaged bytes, before any value reaches
// mxlab, so no validation through the API can come first; and a check that merely survived in
// another process does not make the same reads safe here (heap corruption depends on layout).
//
// So a forked child opens the file first and reads it whole into a new in-memory HDF5 file
// (every link: a hard link that does not open is damage, not absence; every group, dataset,
// attribute and value), shuts HDF5 down (so that heap damage surfaces there, as an abort in
// free()) and sends back that file's image, which HDF5 wrote itself. lab/io/h5file.h reads
// that image and never decodes a byte of the file in this process. To append (resume, a
// branch), the file itself is opened once the check passed: damage that harmed HDF5 in the
// child without any sign would go unnoticed there (none was found by tests/cpu's fuzz test). The
// child runs under a memory limit and a deadline; its crash, runaway allocation or hang becomes
// an mxlab::Error naming the file, and an error it met is rethrown here as it would have been
// thrown in this process (IoError for the file system's refusals). What the system does to the
// check is an IoError too, never damage: a fork or pipe it refuses, a signal from outside
// (SIGKILL of the out-of-memory killer, SIGTERM of a scheduler's cancel); only the signals a
// process raises on itself (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS) count
// as the library crashing on the file.
#pragma once
#include <memory>
#include <string>

namespace mxlab::h5 {

// The clean image of the HDF5 file `path`: the bytes of an HDF5 file with the same groups,
// datasets (stored contiguous at their current shapes), attributes and values; or an exception
// saying on one line why the file cannot be read whole. Recent images are kept by file version
// (device, inode, size, modification time), so opening one file several times in a row forks
// once. In a multi-threaded program no other thread may be inside HDF5 meanwhile (mxlab holds
// hdf5_mutex() around HDF5 calls, lab/runs/run_driver.h): the child starts as a copy of this
// process, and it leaves the files this process has open alone (it frees what it decoded, but does
// not shut HDF5 down: that would flush the inherited state of those files into them).
std::shared_ptr<const std::string> clean_image(const std::string& path);

// True inside that child (h5file.h then opens the file itself).
bool inside_file_check();

}  // namespace mxlab::h5
