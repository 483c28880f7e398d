# examples.vit_fashion_mnist.resume: two epochs in one run, and one epoch
# with --checkpoint followed by a second run that resumes from it, must print
# the same second epoch (losses and accuracy) and draw the same board: the
# checkpoint restores the weights, the optimizer, the dropout draws, the
# shuffles and the board's curves.
#   cmake -DEXE=... -DWORK=... -P vit_resume.cmake
set(args --train-size 256 --val-size 256 --img-size 32 --patch-size 8 --num-hiddens 64
         --mlp-num-hiddens 128 --num-heads 4 --threads 2)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
set(pattern "epoch 2/2: train_loss [0-9.]+, val_loss [0-9.]+, val_acc [0-9.]+")

execute_process(COMMAND "${EXE}" ${args} --epochs 2 --svg "${WORK}/straight.svg"
                OUTPUT_VARIABLE straight
                ERROR_VARIABLE err RESULT_VARIABLE rc)
if(straight MATCHES "holds neither train-images-idx3-ubyte" OR err MATCHES "holds neither")
  message("SKIP: Fashion-MNIST is not installed")
  return()
endif()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "two epochs: exit ${rc}\n${straight}${err}")
endif()
execute_process(COMMAND "${EXE}" ${args} --epochs 1 --checkpoint "${WORK}/ck.pt"
                OUTPUT_VARIABLE first ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT EXISTS "${WORK}/ck.pt")
  message(FATAL_ERROR "one epoch with --checkpoint: exit ${rc}, no checkpoint?\n${first}${err}")
endif()
execute_process(COMMAND "${EXE}" ${args} --epochs 2 --checkpoint "${WORK}/ck.pt"
                        --svg "${WORK}/resumed.svg" OUTPUT_VARIABLE resumed ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT resumed MATCHES "resumed from .* after epoch 1")
  message(FATAL_ERROR "resuming: exit ${rc}\n${resumed}${err}")
endif()
string(REGEX MATCH "${pattern}" a "${straight}")
string(REGEX MATCH "${pattern}" b "${resumed}")
if(a STREQUAL "" OR NOT a STREQUAL b)
  message(FATAL_ERROR "resumed run differs:\n  straight: '${a}'\n  resumed:  '${b}'")
endif()
file(READ "${WORK}/straight.svg" straight_svg)
file(READ "${WORK}/resumed.svg" resumed_svg)
if(NOT straight_svg STREQUAL resumed_svg)
  message(FATAL_ERROR "the resumed run's board differs from the straight run's: "
                      "${WORK}/straight.svg, ${WORK}/resumed.svg")
endif()
# Another recipe refuses the checkpoint, naming what differs.
execute_process(COMMAND "${EXE}" ${args} --batch-size 64 --epochs 3 --checkpoint "${WORK}/ck.pt"
                OUTPUT_VARIABLE other ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "was written by another recipe")
  message(FATAL_ERROR "another recipe was not refused: exit ${rc}\n${other}${err}")
endif()
message("same second epoch: ${a}")
