# gdp-ckpt: writes seeded synthetic checkpoints and describes existing ones (examples/gdp_ckpt.c).
# Linked statically: info lists tensors through the internal safetensors reader (src/safetensors.h).
add_executable(gdp-ckpt ${CMAKE_CURRENT_LIST_DIR}/gdp_ckpt.c)
target_include_directories(gdp-ckpt PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(gdp-ckpt PRIVATE gdp_static gdp_options)
