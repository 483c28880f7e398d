// The translation unit that makes the build tree's precompiled header
// (cmake/D2LPrecompiled.cmake); it has no code of its own.
