// Writing inside an output directory without ever writing through a symbolic link.
//
// Every file mxlab writes in a directory it was given (run files, their snapshots, checkpoints,
// locks, index.csv, exported CSV and .npy files) is created fresh under a name of its own with
// O_CREAT | O_EXCL | O_NOFOLLOW and then renamed into place (rename(2) replaces a link, it never
// follows one), or, for the run file that is appended to, refused when its name is a link. So a
// link planted at one of those names (dangling or not) can neither redirect a write outside the
// directory nor truncate its target. The directory given on the command line may itself be a
// link (`runs -> /scratch/runs`); the names inside it are what is checked.
#pragma once
#include <string>

namespace mxlab {

// Creates `path` as a new, empty regular file open for writing (mode 0644) and returns its file
// descriptor. Whatever entry had that name before is removed first (unlink(2) removes a link,
// never its target): use it only for names that belong to mxlab (temp files). Throws IoError
// naming `path` (or `report_as`, when given: the file the caller is writing) on failure.
int create_fresh_file(const std::string& path, const std::string& report_as = "");

// Throws IoError (ELOOP) when `path` is a symbolic link (dangling or not), saying that mxlab
// does not write through links in its output directories and what to do. No-op when `path`
// does not exist or is anything else.
void refuse_symlink(const std::string& path);

// Creates directory `dir` (and missing parents, `mkdir -p`). Components below `root` (a
// prefix of `dir`) must be real directories: one that is a symbolic link is refused (IoError,
// ELOOP). `root` itself and the path above it may be links.
void make_dirs_below(const std::string& root, const std::string& dir);

}  // namespace mxlab
